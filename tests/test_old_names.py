"""Old import paths keep working (issue 61): each module that moved is still importable by its old name
(:data:`satrl.moved.MOVED`, a finder on ``sys.meta_path``), which gives the very module at the new path, with one
DeprecationWarning per old name and process that names the importing line; the config's face keeps every public
name it had; the string targets a peer names (vLLM's ``worker_extension_cls``, verl's Hydra ``_target_``) name
what is there (``tests/test_layers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

from run_helpers import REPO
from satrl.moved import MOVED

# The names the folders' move (issue 61) left behind, which users, docs and peers' configs name, and the moved
# package's modules.
OLD = {
    "satrl.pipeline.run_config": "satrl.config.run",
    "satrl.pipeline.orchestrator": "satrl.loop.orchestrator",
    "satrl.pipeline.progress": "satrl.loop.progress",
    "satrl.pipeline.rollouts": "satrl.loop.rollouts",
    "satrl.pipeline.rundir": "satrl.rundir.files",
    "satrl.pipeline.resume_check": "satrl.rundir.resume_check",
    "satrl.pipeline.launch": "satrl.launch",
    "satrl.pipeline.engine_side": "satrl.pipeline.engines_host",
}
HOST = ("backends", "engine_process", "local_backends", "ray_backend", "worker")
UNDER = {**{f"satrl.pipeline.launch.{m}": f"satrl.launch.{m}" for m in ("data_parallel", "setup", "stand_ins")},
         **{f"satrl.pipeline.engine_side.{m}": f"satrl.pipeline.engines_host.{m}" for m in HOST}}  # fmt: skip
# satrl/config.py's __all__ before it became the package's face.
FACE = ["DEVICES", "FLOAT32_MAX", "MAX_BATCH_SAMPLES", "AggregationName", "BackendName", "CheckpointConfig",
        "CollapseConfig", "ConfigError", "Device", "DiagnosticsConfig", "EngineConfig", "EngineName", "EvalConfig",
        "LagConfig", "ModelConfig", "NumericsName", "ObjectiveConfig", "RayConfig", "RunConfig", "ScheduleName",
        "Section", "TaskConfig", "TaskName", "TrainConfig", "TransportName", "WeightsConfig", "apply_override",
        "build_config", "check_before_run", "check_device_here", "check_device_name", "load_config"]  # fmt: skip

# Imports every old name twice (the second time after forgetting it), then says, per old name, whether it is the
# new module both times, and where its DeprecationWarnings came from.
PROBE = """
import importlib, json, sys, warnings
moved = json.loads(sys.argv[1])
same = {}
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for old, new in moved.items():
        first = importlib.import_module(old)
        sys.modules.pop(old)
        second = importlib.import_module(old)
        same[old] = first is second is importlib.import_module(new) is sys.modules[old]
    from satrl.pipeline.orchestrator import train
    from satrl.loop.orchestrator import train as new_train
    from satrl.pipeline.engine_side import local_backends as old_local
    from satrl.pipeline.engine_side.worker import RolloutWorker as old_worker
    from satrl.pipeline.engines_host import local_backends
    from satrl.pipeline.engines_host.worker import RolloutWorker
warned = {old: [] for old in moved}
for w in seen:
    old = str(w.message).split(" moved to ")[0]
    if issubclass(w.category, DeprecationWarning) and old in warned:
        warned[old].append([w.filename, str(w.message)])
print(json.dumps({"same": same, "warned": warned,
                  "objects": [train is new_train, old_local is local_backends, old_worker is RolloutWorker]}))
"""


def test_the_old_names_are_the_ones_kept():
    assert MOVED == OLD


def test_each_old_name_is_the_new_module_and_warns_once():
    moved = {**OLD, **UNDER}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(moved)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert found["same"] == dict.fromkeys(moved, True) and found["objects"] == [True] * 3
    assert found["warned"] == {
        old: [["<string>", f"{old} moved to {new}; the old path will be removed"]] for old, new in moved.items()}


def test_the_config_face_keeps_its_names():
    import satrl.config
    from satrl import config_base
    from satrl.config import run

    assert satrl.config.__all__ == sorted(FACE)
    assert satrl.config.RunConfig is run.RunConfig and satrl.config.ConfigError is config_base.ConfigError
    assert all(getattr(satrl.config, name) is not None for name in FACE)


def test_the_tests_use_the_new_names():
    """Only the two tests of the old names name them: the others patch and import the modules where they live."""
    from test_layers import old_names

    here = REPO / "tests"
    found = {str(p.relative_to(here)): old_names(p.read_text()) for p in sorted(here.rglob("*.py"))
             if p.name not in ("test_layers.py", "test_old_names.py")}  # fmt: skip
    assert {name: old for name, old in found.items() if old} == {}
