"""Run configuration: one pydantic model per component, YAML loading, ``key=value`` overrides.

The config is validated up front (a bad key or value is a :class:`ConfigError` naming the field and what is
allowed), turned into plain arguments at the edge of each component, and saved resolved with every run. A field
that names a choice (an engine, a task, a schedule, ...) is checked against that choice's registry
(:mod:`satrl.registry`), the one list of valid names: a newly registered engine or task is valid here at once.

The package holds the run config (:mod:`satrl.config.run`: assembled from the sections, which the pipeline
imports) and this module, its public face. The sections stand on the leaf :mod:`satrl.config_base` (floor 0:
:class:`ConfigError`, the strict section base, the device names), and each lives with its component
(``satrl/<component>/config.py``; ``LagConfig`` with the lag schedules, ``RayConfig`` with the engine side in
:mod:`satrl.pipeline.backend_config`). The face re-exports them all, each name imported when first asked for, so
that importing :mod:`satrl.config.run` runs nothing more than it needs. The programs and users import the face; no
library module does, directly or through another (``tests/test_layers.py``; docs/design.md, "Layers and the rules
between them").
"""

from types import ModuleType

from satrl.lazy import names_from


def _module(name: str) -> ModuleType:
    """The module ``name`` of the config, imported when one of its names is first asked for (import statements,
    so the import graph sees each)."""
    match name:
        case "base":
            from satrl import config_base as module
        case "collapse":
            from satrl.diagnostics import collapse as module
        case "diagnostics":
            from satrl.diagnostics import config as module
        case "engines":
            from satrl.engines import config as module
        case "models":
            from satrl.models import config as module
        case "objectives":
            from satrl.objectives import config as module
        case "backend":
            from satrl.pipeline import backend_config as module
        case "schedules":
            from satrl.pipeline import schedules as module
        case "tasks":
            from satrl.tasks import config as module
        case "training":
            from satrl.training import config as module
        case "weights":
            from satrl.weights import config as module
        case _:
            from satrl.config import run as module
    return module


_WHERE = {
    "DEVICES": "base", "ConfigError": "base", "Device": "base", "Section": "base", "check_device_here": "base",
    "check_device_name": "base", "CollapseConfig": "collapse", "DiagnosticsConfig": "diagnostics",
    "EngineConfig": "engines", "EngineName": "engines", "NumericsName": "engines", "ModelConfig": "models",
    "FLOAT32_MAX": "objectives", "AggregationName": "objectives", "ObjectiveConfig": "objectives",
    "RayConfig": "backend", "BackendName": "run", "CheckpointConfig": "run", "EvalConfig": "run", "RunConfig": "run",
    "apply_override": "run", "build_config": "run", "check_before_run": "run", "load_config": "run",
    "LagConfig": "schedules", "ScheduleName": "schedules", "TaskConfig": "tasks", "TaskName": "tasks",
    "MAX_BATCH_SAMPLES": "training", "TrainConfig": "training", "TransportName": "weights",
    "WeightsConfig": "weights",
}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
