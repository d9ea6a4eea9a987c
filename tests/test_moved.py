"""Old import paths keep working (issue 61): each module that moved leaves an alias at its old path
(:mod:`satrl.moved`) that gives the very module now at the new path, with one DeprecationWarning per process that
names the importing line; the config's face keeps every public name it had; the string targets a peer names
(vLLM's ``worker_extension_cls``, verl's Hydra ``_target_``) name what is there (``tests/test_layers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

from run_helpers import REPO
from test_layers import aliases

# The paths the folders' move (issue 61) left behind, which users, docs and peers' configs name.
MOVED = {
    "satrl.config_base": "satrl.config.base",
    "satrl.pipeline.run_config": "satrl.config.run",
    "satrl.pipeline.orchestrator": "satrl.loop.orchestrator",
    "satrl.pipeline.progress": "satrl.loop.progress",
    "satrl.pipeline.rollouts": "satrl.loop.rollouts",
    "satrl.pipeline.rundir": "satrl.rundir.files",
    "satrl.pipeline.resume_check": "satrl.rundir.resume_check",
    "satrl.pipeline.launch": "satrl.launch",
    "satrl.pipeline.launch.data_parallel": "satrl.launch.data_parallel",
    "satrl.pipeline.launch.setup": "satrl.launch.setup",
    "satrl.pipeline.launch.stand_ins": "satrl.launch.stand_ins",
}
# satrl/config.py's __all__ before it became the package's face.
FACE = ["DEVICES", "FLOAT32_MAX", "MAX_BATCH_SAMPLES", "AggregationName", "BackendName", "CheckpointConfig",
        "CollapseConfig", "ConfigError", "Device", "DiagnosticsConfig", "EngineConfig", "EngineName", "EvalConfig",
        "LagConfig", "ModelConfig", "NumericsName", "ObjectiveConfig", "RayConfig", "RunConfig", "ScheduleName",
        "Section", "TaskConfig", "TaskName", "TrainConfig", "TransportName", "WeightsConfig", "apply_override",
        "build_config", "check_before_run", "check_device_here", "check_device_name", "load_config"]  # fmt: skip

# Imports every old path twice (the second time its file runs again), then says, per old path: whether it is the new
# module (a package: its own, which lends the new one's names), and where its warnings came from.
PROBE = """
import importlib, json, sys, warnings
moved = json.loads(sys.argv[1])
out = {}
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for old, new in moved.items():
        first = importlib.import_module(old)
        sys.modules.pop(old)
        second = importlib.import_module(old)
        module = importlib.import_module(new)
        if hasattr(module, "__path__"):  # a package: its old folder holds the old submodules, its names are new's
            setup = importlib.import_module(new + ".setup")
            same = first.__name__ == old and first.setup is setup and second.setup is setup
        else:
            same = first is module is second
        out[old] = {"same": same, "warned": []}
for w in seen:
    old = str(w.message).split(" moved to ")[0]
    if issubclass(w.category, DeprecationWarning) and old in out:
        out[old]["warned"].append([w.filename, str(w.message)])
print(json.dumps(out))
"""


def test_the_old_paths_are_the_ones_kept():
    assert aliases() == MOVED


def test_each_old_path_is_the_new_module_and_warns_once():
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(MOVED)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert {old: f["same"] for old, f in found.items()} == dict.fromkeys(MOVED, True)
    # satrl.config_base first: its first import is the probe's, not satrl.weights.config's (tests/test_layers.py:
    # WAITING), so every warning names the probe's line
    assert {old: f["warned"] for old, f in found.items()} == {
        old: [["<string>", f"{old} moved to {new}: import that (the old path will go)"]] for old, new in MOVED.items()}


def test_the_config_face_keeps_its_names():
    import satrl.config
    from satrl.config import base, run

    assert satrl.config.__all__ == sorted(FACE)
    assert satrl.config.RunConfig is run.RunConfig and satrl.config.ConfigError is base.ConfigError
    assert all(getattr(satrl.config, name) is not None for name in FACE)
