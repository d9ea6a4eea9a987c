"""The registry where ``weights.transport`` names a transport, and what each declares.

Each registry entry (:class:`TransportKind`) declares what it needs, so no caller compares transport names:
whether the version is broadcast over the trainer's group (``satrl.weights.link``) or carried in its message,
whether the engine must have a weight-transfer API of its own, what the engine must be built with, and whether
the snapshot store must keep full fp32 copies. What a version does on each backend, its ``push`` says top to
bottom (``satrl.pipeline.engines_host.local_backends.ProcessBackend.push``); which backends carry which
transport, each backend declares (``satrl.pipeline.engines_host.backends.BackendKind.transports``; this layer
never imports the pipeline). Imports no torch, so that a config is checked without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from satrl.registry import Registry


@dataclass(frozen=True)
class TransportKind:
    """One ``weights.transport``: what it needs (declared, never compared)."""

    doc: str
    broadcast: bool = False  # the version travels as buckets over the trainer's group, the queue names it only
    own_engine_transfer: bool = False  # the engine must have a weight-transfer API of its own (types.TransferEngine)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # what the engine is built with to receive this way
    full_snapshots: bool = False  # the snapshot store keeps the trainer's fp32 copy, not an engine-dtype one


TRANSPORTS: Registry[TransportKind] = Registry("weights transport")
TRANSPORTS.register("inproc", TransportKind(
    full_snapshots=True,
    doc="a call (sequential), one pickled state dict per version on the local backend's queue, Ray's object store"))
TRANSPORTS.register("dist", TransportKind(
    broadcast=True,
    doc="a 2-process gloo group between the trainer and the engine process, each version broadcast once as "
        "buckets in the engine's dtype"))
TRANSPORTS.register("vllm", TransportKind(
    broadcast=True, own_engine_transfer=True,
    engine_kwargs={"weight_transfer": True},
    doc="the same broadcast, received and loaded by vLLM's own weight-transfer API inside vLLM's workers (the "
        "engine holds one version)"))  # fmt: skip
