"""Run configuration: one pydantic model per component, YAML loading, ``key=value`` overrides.

The config is validated up front (a bad key or value is a :class:`ConfigError` naming the field and what is
allowed), turned into plain arguments at the edge of each component, and saved resolved with every run. A field
that names a choice (an engine, a task, a schedule, ...) is checked against that choice's registry
(:mod:`satrl.registry`), the one list of valid names: a newly registered engine or task is valid here at once.

This module is the public face, at the top beside the command line: each section lives with its component
(``satrl/<component>/config.py``; ``LagConfig`` with the lag schedules, ``RayConfig`` in
:mod:`satrl.pipeline.backend_config`), :class:`ConfigError` and the section base in the leaf
:mod:`satrl.config_base`, and the run config is assembled from them in :mod:`satrl.pipeline.run_config`, which
the pipeline imports. No library module imports this one (docs/design.md, "Layers and the rules between them").
"""

from __future__ import annotations

from satrl.config_base import DEVICES, ConfigError, Device, Section, check_device_here, check_device_name
from satrl.diagnostics.collapse import CollapseConfig
from satrl.diagnostics.config import DiagnosticsConfig
from satrl.engines.config import EngineConfig, EngineName, NumericsName
from satrl.models.config import ModelConfig
from satrl.objectives.config import FLOAT32_MAX, AggregationName, ObjectiveConfig
from satrl.pipeline.backend_config import RayConfig
from satrl.pipeline.run_config import (
    BackendName,
    CheckpointConfig,
    EvalConfig,
    RunConfig,
    apply_override,
    build_config,
    check_before_run,
    load_config,
)
from satrl.pipeline.schedules import LagConfig, ScheduleName
from satrl.tasks.config import TaskConfig, TaskName
from satrl.training.config import MAX_BATCH_SAMPLES, TrainConfig
from satrl.weights.config import TransportName, WeightsConfig

__all__ = [
    "DEVICES",
    "FLOAT32_MAX",
    "MAX_BATCH_SAMPLES",
    "AggregationName",
    "BackendName",
    "CheckpointConfig",
    "CollapseConfig",
    "ConfigError",
    "Device",
    "DiagnosticsConfig",
    "EngineConfig",
    "EngineName",
    "EvalConfig",
    "LagConfig",
    "ModelConfig",
    "NumericsName",
    "ObjectiveConfig",
    "RayConfig",
    "RunConfig",
    "ScheduleName",
    "Section",
    "TaskConfig",
    "TaskName",
    "TrainConfig",
    "TransportName",
    "WeightsConfig",
    "apply_override",
    "build_config",
    "check_before_run",
    "check_device_here",
    "check_device_name",
    "load_config",
]
