"""Test-suite root. Its presence puts tests/ on sys.path (pytest's default import mode), so every test
folder can import the shared helpers in tests/run_helpers.py. The tiny-run fixtures live here, once: ``tiny_cfg``
and ``run_tiny`` (a fresh run per test), ``shared_tiny`` and ``shared_dp`` (reference runs, one process and data
parallel, trained once per test session; ``shared_train``: a ``python -m satrl train`` run in a fresh process, once per
test session)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from run_helpers import REPO, TINY, dp_env, torchrun


@pytest.fixture
def tiny_cfg(tmp_path):
    """``tiny_cfg(*overrides, name="run", config=None)``: the tiny config (run_helpers.TINY) with ``overrides``, its
    ``out`` under this test's tmp_path."""
    from satrl.config import load_config

    def make(*overrides: str, name: str = "run", config: str | None = None):
        base = REPO / "configs" / config if config else None
        return load_config(base, [*TINY, *overrides, f"out={tmp_path / name}"])

    return make


@pytest.fixture
def run_tiny(tiny_cfg):
    """``run_tiny(*overrides, name="run", config=None, resume=False)``: train the tiny config in this process into
    a run folder of this test's own and return it."""
    from satrl.loop.orchestrator import train

    def run(*overrides: str, name: str = "run", config: str | None = None, resume: bool = False) -> Path:
        cfg = tiny_cfg(*overrides, name=name, config=config)
        train(cfg, resume=resume)
        return cfg.run_dir()

    return run


def _once(tmp_path_factory, folder: str, what: list[str], make) -> Path:
    """The run folder ``make(out)`` trains for the settings ``what``, made once per test session. Under
    pytest-xdist the workers (separate processes) share one folder beside their own, and a file lock per key lets
    one worker train a run while the others wait for it."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / folder
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    out, done = root / key / "run", root / key / "done"
    with FileLock(str(root / f"{key}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # a worker that died mid-run left it half written
            make(out)
            done.write_text(json.dumps(what))
    return out


@pytest.fixture(scope="session")
def shared_tiny(tmp_path_factory):
    """``shared_tiny(*overrides)``: the tiny config's finished run with ``overrides``, trained once per test session
    and shared by every test that asks for the same overrides (read it, never write into it: copy it with
    ``shutil.copytree`` to change it)."""

    def shared(*overrides: str) -> Path:
        from satrl.config import load_config
        from satrl.loop.orchestrator import train

        return _once(tmp_path_factory, "shared-tiny-runs", [*TINY, *overrides],
                     lambda out: train(load_config(None, [*TINY, *overrides, f"out={out}"])))  # fmt: skip

    return shared


@pytest.fixture(scope="session")
def shared_dp(tmp_path_factory):
    """``shared_dp(*args)``: the finished run of ``torchrun --nproc_per_node=2 -m satrl train *args`` (a config
    file, then overrides: run_helpers.DP_ARGS / DP_DIST_ARGS), trained once per test session and shared as
    ``shared_tiny`` shares its runs (read it, never write into it)."""

    def make(args: list[str], out: Path) -> None:
        done = subprocess.run(torchrun(*args, out=out), env=dp_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    def shared(*args: str) -> Path:
        what = [str(a) for a in args]
        return _once(tmp_path_factory, "shared-dp-runs", what, lambda out: make(what, out))

    return shared


@pytest.fixture(scope="session")
def shared_train(tmp_path_factory):
    """``shared_train(*args)``: the finished run of ``python -m satrl train *args`` (a config file, then overrides)
    in a fresh process, made once per test session and shared as ``shared_tiny`` shares its runs (read it, never
    write into it). For runs whose engine must start as in a real run (vLLM's own processes)."""

    def make(args: list[str], out: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "satrl", "train", *args, f"out={out}"], capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]

    def shared(*args: str) -> Path:
        what = [str(a) for a in args]
        return _once(tmp_path_factory, "shared-train-runs", what, lambda out: make(what, out))

    return shared


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
    "tests/faults/test_chaos.py": "chaos: runs killed at 10 seeded points, each resumed and compared",
    "tests/faults/test_hostile.py": "hostile inputs and fuzzed configs, each a `satrl` process",
    "tests/faults/test_engine_hang.py": "hung engines: waits past engine.timeout_s",
}


# The files that ran longest (the targets' --durations), longest first; they and then every other file with a slow
# test are collected before the rest. pytest-xdist (--dist loadfile) hands whole files out in collection order, so a
# long file collected late would run alone at the end while the other processes idle.
LONG_FILES = (
    "tests/engines/test_vllm_train.py",
    "tests/engines/test_vllm_runs.py",
    "tests/pipeline/test_weight_transport.py",
    "tests/experiments/test_committed_reports.py",
    "tests/e2e/test_data_parallel.py",
    "tests/e2e/test_dp_engine_faults.py",
    "tests/test_gpu_check.py",
    "tests/faults/test_round5_ctrl_c.py",
    "tests/pipeline/test_inflight.py",
    "tests/faults/test_engine_hang.py",
    "tests/pipeline/test_ray_backend.py",
    "tests/test_doc_snippets.py",
    "tests/faults/test_chaos.py",
    "tests/integrations/test_trl.py",
    "tests/integrations/test_trl_vcpo.py",
    "tests/experiments/test_report.py",
    "tests/training/test_compile.py",
)


def pytest_collection_modifyitems(session, config, items):
    slow: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if path in SLOW_GROUPS or item.get_closest_marker("slow") is not None:
            slow[path] = slow.get(path, 0) + 1
    config._satrl_slow = slow  # module path -> its slow tests in this selection
    config._satrl_announced = set()
    first = {path: i for i, path in enumerate(LONG_FILES)}
    later = {True: len(LONG_FILES), False: len(LONG_FILES) + 1}  # files with slow tests, then the rest
    items.sort(key=lambda item: first.get(path := item.nodeid.split("::")[0], later[path in slow]))  # stable


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
