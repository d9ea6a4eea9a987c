"""What a backend reads of the run config: the ``ray:`` section (:class:`RayConfig`) and, for a backend's
``options(cfg)`` (``satrl.pipeline.engines_host.backends.BackendKind``), the sections it takes its settings from
(:class:`BackendSections`, which the run config is).

A leaf of the pipeline, beside ``schedules`` and ``errors``: the engine side declares here what it needs of the
config, and :class:`satrl.config.run.RunConfig`, which validates ``backend`` against the engine side's
registry, sits above it (docs/design.md, "Layers and the rules between them")."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from satrl.config_base import Section
from satrl.engines.config import EngineConfig
from satrl.weights.config import WeightsConfig


class RayConfig(Section):
    """Where ``backend=ray`` runs its engine actors (docs/ray.md). These choose placement, never the samples."""

    address: str | None = Field(
        None, description="Ray cluster to join (auto, ray://head:10001, ...); null: a private local cluster."
    )
    workers: int = Field(1, ge=1, description="Engine actors; each batch's prompt groups are split across them.")
    gpus: float = Field(0.0, ge=0, description="GPUs reserved per engine actor.")


class BackendSections(Protocol):
    """The run config as a backend's ``options(cfg)`` sees it: the chosen ``backend`` and the sections its
    settings come from (the engine's deadlines and restarts, the weight transport, the Ray placement)."""

    @property
    def backend(self) -> str: ...

    @property
    def engine(self) -> EngineConfig: ...

    @property
    def weights(self) -> WeightsConfig: ...

    @property
    def ray(self) -> RayConfig: ...
