"""Test-suite root. Its presence puts tests/ on sys.path (pytest's default import mode), so every test
folder can import the shared helpers in tests/run_helpers.py."""

import pytest


@pytest.fixture
def trained_ids(monkeypatch):
    """Ids of every sample the trainer steps on, in order."""
    from satrl.training import trainer as trainer_mod

    seen: list[str] = []
    original = trainer_mod.Trainer.step

    def spy(self, mb, *args, **kwargs):
        seen.extend(mb.sample_ids)
        return original(self, mb, *args, **kwargs)

    monkeypatch.setattr(trainer_mod.Trainer, "step", spy)
    return seen


# -- `make test`'s progress through its slow groups -------------------------------------------------------
# A slow group (a module with tests marked `slow`, or one named here) can run for minutes without a dot;
# one line as it starts says which and why, so a user knows the suite is working (`-q` or not).
SLOW_GROUPS = {
    "tests/faults/test_chaos.py": "chaos: kill points, hostile inputs, engine kills and hangs, damaged checkpoints",
    "tests/faults/test_hostile.py": "hostile inputs and fuzzed configs, each a `satrl` process",
    "tests/faults/test_engine_hang.py": "hung engines: waits past engine.timeout_s",
}


def pytest_collection_modifyitems(session, config, items):
    slow: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if path in SLOW_GROUPS or item.get_closest_marker("slow") is not None:
            slow[path] = slow.get(path, 0) + 1
    config._satrl_slow = slow  # module path -> its slow tests in this selection
    config._satrl_announced = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    config = _CONFIG[0] if _CONFIG else None
    path = nodeid.split("::")[0]
    slow = getattr(config, "_satrl_slow", {})
    if config is None or path not in slow or path in config._satrl_announced:
        return
    config._satrl_announced.add(path)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        what = SLOW_GROUPS.get(path, "end-to-end runs, several processes each")
        if reporter._tw.width_of_current_line:  # -q: after the previous module's dots
            reporter._tw.line()
        reporter.write_line(f"[slow group] {path}: {slow[path]} test(s), {what}; it can take minutes")


_CONFIG: list = []


def pytest_configure(config):
    _CONFIG[:] = [config]
