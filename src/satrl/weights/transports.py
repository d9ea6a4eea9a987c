"""The registry where ``weights.transport`` names a transport, and what each declares.

Each transport's trainer side (:mod:`satrl.weights.trainer_sides`: it mirrors the versions the engine side holds
and sends each once) is imported where it is built, so that the config checks a transport's name, and reads what
it declares, without importing torch.

Each registry entry (:class:`TransportKind`) declares what it needs, so no caller compares transport names:
whether the engine must have a weight-transfer API of its own, what the engine must be built with, and whether
the snapshot store must keep full fp32 copies. Which backends carry it, each backend declares
(``satrl.pipeline.engines_host.backends.BackendKind.transports``; this layer never imports the pipeline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from satrl.registry import Registry

if TYPE_CHECKING:
    from satrl.weights.trainer_sides import TrainerSide, Wiring


@dataclass(frozen=True)
class TransportKind:
    """One ``weights.transport``: how to build its trainer side, and what it needs (declared, never compared)."""

    build: Callable[[Wiring], TrainerSide]
    doc: str
    own_engine_transfer: bool = False  # the engine must have a weight-transfer API of its own (types.TransferEngine)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # what the engine is built with to receive this way
    full_snapshots: bool = False  # the snapshot store keeps the trainer's fp32 copy, not an engine-dtype one


def _inproc(w: Wiring) -> TrainerSide:
    from satrl.weights.trainer_sides import InprocTransport

    return InprocTransport(w.send, w.stash)


def _dist(w: Wiring) -> TrainerSide:
    from satrl.weights.trainer_sides import DistTransport

    return DistTransport(w)


def _vllm(w: Wiring) -> TrainerSide:
    from satrl.weights.trainer_sides import TO_ENGINE_API, DistTransport

    return DistTransport(w, TO_ENGINE_API)


TRANSPORTS: Registry[TransportKind] = Registry("weights transport")
TRANSPORTS.register("inproc", TransportKind(
    _inproc, full_snapshots=True,
    doc="a call (sequential), one pickled state dict per version on the local backend's queue, Ray's object store"))
TRANSPORTS.register("dist", TransportKind(
    _dist,
    doc="a 2-process gloo group between the trainer and the engine process, each version broadcast once as "
        "buckets in the engine's dtype"))
TRANSPORTS.register("vllm", TransportKind(
    _vllm, own_engine_transfer=True,
    engine_kwargs={"weight_transfer": True},
    doc="the same broadcast, received and loaded by vLLM's own weight-transfer API inside vLLM's workers (the "
        "engine holds one version)"))  # fmt: skip
