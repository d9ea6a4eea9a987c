"""What the verl plug-in costs every verl process: ``import verl`` loads it (the ``verl.plugins`` entry point) in the
driver and in every Ray worker, so it must import almost nothing, and register its losses all the same.

Each check runs a fresh ``python -c "import verl"`` twice, with verl's plug-in discovery off
(``VERL_USE_EXTERNAL_PLUGINS=none``) and on (the plug-in named through a temporary entry point: verl's own
discovery, the test of that path; ``test_verl.py::test_plugin_is_loaded_by_a_fresh_import_verl`` tests verl's other
hook, VERL_USE_EXTERNAL_MODULES), and compares the modules each has imported.
Skips without verl, never under ``SATRL_REQUIRE_VERL=1`` (``make test-verl``). docs/benchmarks.md has the times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from run_helpers import Extra

with Extra("verl") as verl_extra:
    import verl  # noqa: F401

    from satrl.integrations._verl_variants import VARIANTS
VERL_MISSING = verl_extra.missing

pytestmark = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))

# All that `import verl` may import of satrl: the entry point and the leaves its config checks need.
HOOK_MODULES = {
    "satrl",
    "satrl.integrations",
    "satrl.integrations.verl",
    "satrl.integrations._verl_mu",
    "satrl.integrations._mu",
    "satrl.integrations._verl_variants",
    "satrl.registry",
}

PROBE = textwrap.dedent("""
    import json, sys
    import verl
    out = {"after_import_verl": sorted(sys.modules)}
    hooked = any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
    from verl.trainer.ppo import core_algos, rollout_corr_helper
    out["registered"] = sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith("sat"))
    out["guarded"] = bool(getattr(rollout_corr_helper.apply_bypass_mode, "_satrl_guard", False))
    out["body_before_first_use"] = "satrl.integrations._verl_loss" in sys.modules
    out["hook_left_meta_path"] = hooked and not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
    if "satrl.integrations.verl" in sys.modules:
        from hydra.utils import get_class
        cls = get_class("satrl.integrations.verl.SatPolicyLossConfig")  # verl's _target_, the body on first use
        out["target"] = f"{cls.__module__}.{cls.__qualname__}"
    print("SATRL_PROBE " + json.dumps(out))
""")


def probe(tmp_path, plugins: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    env.update(OMP_NUM_THREADS="1", VERL_USE_EXTERNAL_PLUGINS="none")
    if plugins:  # the entry point verl discovers, whatever the installed satrl's metadata says
        info = tmp_path / "satrl_verl_probe-0.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: satrl-verl-probe\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text("[verl.plugins]\nsatrl_probe = satrl.integrations.verl\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
        env["VERL_USE_EXTERNAL_PLUGINS"] = "satrl_probe"
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("SATRL_PROBE ")]
    assert len(line) == 1, out.stdout[-2000:]
    return json.loads(line[0].split(" ", 1)[1])


def test_import_verl_loads_only_the_plugins_hook_and_registers_on_first_use(tmp_path):
    """The plug-in adds to ``import verl`` only its entry point and the leaves of its config checks (no
    ``satrl.objectives``, no verl module verl did not import itself, so no transformers or accelerate), and still:
    its losses are in verl's registry once ``core_algos`` is imported, verl's bypass helper is guarded, the hook
    leaves ``sys.meta_path``, and the loss body loads on first use (here: verl's ``_target_`` for its config)."""
    without, with_plugin = probe(tmp_path, plugins=False), probe(tmp_path, plugins=True)
    added = set(with_plugin["after_import_verl"]) - set(without["after_import_verl"])
    assert added <= HOOK_MODULES, sorted(added - HOOK_MODULES)
    assert "satrl.integrations.verl" in added
    assert without["registered"] == [] and not without["guarded"]
    assert with_plugin["registered"] == sorted(VARIANTS)
    assert with_plugin["guarded"] and with_plugin["hook_left_meta_path"]
    assert not with_plugin["body_before_first_use"]
    assert with_plugin["target"] == "satrl.integrations._verl_loss.SatPolicyLossConfig"


def test_the_hook_registers_at_once_when_core_algos_is_already_imported():
    """In this process verl's core_algos was imported (with the plug-in); register() is idempotent and the
    losses in verl's registry are the plug-in's stubs, whose body is satrl's loss."""
    from verl.trainer.ppo import core_algos, rollout_corr_helper

    import satrl.integrations.verl as sv

    assert rollout_corr_helper.apply_bypass_mode._satrl_guard  # both watched modules imported: hook gone
    assert sv._after_import not in sys.meta_path and not sv._after_import.callbacks
    sv._after_import.watch(sv.CORE_ALGOS, sv._register_when_imported)  # already imported: runs now, no finder
    assert sv._after_import not in sys.meta_path
    assert all(core_algos.get_policy_loss_fn(name) is sv.LOSS_FNS[name] for name in VARIANTS)
    assert sv.SatPolicyLossConfig.__module__ == "satrl.integrations._verl_loss"
    assert "SatPolicyLossConfig" in dir(sv)
    with pytest.raises(AttributeError):
        sv.no_such_name  # noqa: B018


def test_a_name_another_plugin_holds_is_a_warning_not_a_broken_core_algos(monkeypatch):
    """register() refuses to replace another plug-in's loss; from the post-import hook that refusal is a
    RuntimeWarning, so verl's own ``core_algos`` import (every verl trainer's) still succeeds."""
    from verl.trainer.ppo import core_algos

    import satrl.integrations.verl as sv

    def foreign(*args, **kwargs):  # another plug-in's "sat"
        raise AssertionError("not called")

    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "sat", foreign)
    with pytest.raises(ValueError, match="verl already has a policy loss 'sat'"):
        sv.register()
    with pytest.warns(RuntimeWarning, match="satrl: verl already has a policy loss 'sat'"):
        sv._register_when_imported(core_algos)
    assert core_algos.POLICY_LOSS_REGISTRY["sat"] is foreign
