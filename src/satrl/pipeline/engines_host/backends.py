"""The registry where ``backend`` names where the rollout worker runs, and what each backend declares.

``sequential`` (in this process) and ``local`` (in a child process) are :mod:`.local_backends`, ``ray`` (Ray actors,
an optional extra) :mod:`.ray_backend`: each is imported where it is built, so that the config checks a backend's
name, and the transports it carries, without importing torch. Every backend takes the same
:class:`~satrl.pipeline.engines_host.worker.RolloutRequest` objects and returns the same samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from satrl.registry import Registry

if TYPE_CHECKING:
    from satrl.pipeline.backend_config import BackendSections as RunConfig
    from satrl.pipeline.engines_host.worker import RolloutRequest, WorkerSpec
    from satrl.types import Sample
    from satrl.weights.snapshot import Snapshot


class Backend(Protocol):
    """Where the rollout worker runs. ``restarts``: engine processes started again after a fault, over the run
    (``perf/engine_restarts``)."""

    restarts: int

    def push(self, version: int, weights: Snapshot) -> None:
        """Hand the engine side the weights of ``version``, once; it holds them until :meth:`keep` drops them."""

    def keep(self, versions: set[int]) -> None:
        """The engine side may forget every version not in ``versions``."""

    def submit(self, req: RolloutRequest) -> None: ...

    def result(self, b: int) -> list[Sample]: ...

    def ready(self) -> dict[int, list[Sample]]: ...

    def busy_seconds(self) -> float: ...

    def close(self) -> None: ...


def _sequential(spec: WorkerSpec, **options) -> Backend:
    from satrl.pipeline.engines_host.local_backends import SequentialBackend

    return SequentialBackend(spec, **options)


def _local(spec: WorkerSpec, **options) -> Backend:
    from satrl.pipeline.engines_host.local_backends import ProcessBackend

    return ProcessBackend(spec, **options)


def _ray(spec: WorkerSpec, **options) -> Backend:
    from satrl.pipeline.engines_host.ray_backend import RayBackend, RayOptions  # optional extra: ray

    return RayBackend(spec, RayOptions(**options))


def _local_options(cfg: RunConfig) -> dict:
    e = cfg.engine
    return {"timeout_s": e.timeout_s, "start_timeout_s": e.start_timeout_s, "max_restarts": e.max_restarts,
            "transport": cfg.weights.transport, "bucket_bytes": cfg.weights.bucket_mb * 2**20}  # fmt: skip


def _ray_options(cfg: RunConfig) -> dict:
    return {"num_workers": cfg.ray.workers, "address": cfg.ray.address, "num_gpus": cfg.ray.gpus,
            "timeout_s": cfg.engine.timeout_s, "max_hang_restarts": cfg.engine.max_restarts,
            "transport": cfg.weights.transport}  # fmt: skip


@dataclass(frozen=True)
class BackendKind:
    """One ``backend``: how to build it from a worker spec and its own settings, and which config fields those
    settings are (``options(cfg)``), so that no caller compares backend names."""

    build: Callable[..., Backend]
    options: Callable[[RunConfig], dict]
    inflight: bool  # an in-flight rollout can wait for a version on its message path (lag.inflight_every)
    transports: frozenset[str]  # the weights.transport names (TRANSPORTS) it carries; the config refuses the rest


# name (the config's ``backend``) -> its kind; a new backend is one more register call.
BACKENDS: Registry[BackendKind] = Registry("backend")
BACKENDS.register("sequential", BackendKind(  # its engine cannot be restarted
    _sequential, lambda cfg: {"transport": cfg.weights.transport}, inflight=True,
    transports=frozenset({"inproc"})))  # fmt: skip
BACKENDS.register("local", BackendKind(
    _local, _local_options, inflight=True, transports=frozenset({"inproc", "dist", "vllm"})))  # fmt: skip
BACKENDS.register("ray", BackendKind(_ray, _ray_options, inflight=False, transports=frozenset({"inproc"})))


def backend_options(cfg: RunConfig) -> dict:
    """Keyword arguments of the chosen backend beyond the worker spec: the engine's deadlines and restarts and the
    weight transport (``local``), the ``ray:`` section and the rollout deadline (``ray``), the weight transport
    only for ``sequential`` (its engine runs in this process, which cannot restart itself)."""
    return BACKENDS.get(cfg.backend).options(cfg)


def make_backend(name: str, spec: WorkerSpec, **options) -> Backend:
    """The backend ``name`` (the config's ``backend``) running workers built from ``spec``; ``options`` are its
    own settings (:func:`backend_options`)."""
    return BACKENDS.get(name).build(spec, **options)
