"""What the trainer side tells the engine side about a version, in queue order: typed, frozen messages.

The request queue of the ``local`` backend carries these between rollout requests, so a version is put, taken
or loaded before the first request that needs it and forgotten only after the last one. The engine side
(``satrl.pipeline.engines_host.worker.RolloutWorker.receive``) applies them with one ``match``; a message it does
not expect is a ``TypeError``, never a silent no-op.

Which messages a transport sends:

- ``inproc``: :class:`Put` (the weights themselves, or their ref in Ray's object store) and :class:`Keep`;
- ``dist``: :class:`Take` (the version was broadcast over the trainer's group: take it from the inbox) and
  :class:`Keep`;
- ``vllm``: :class:`Load` (the engine loads the broadcast version through its own weight-transfer API) and
  :class:`Keep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Put:
    """Hold ``weights``, those of ``version`` (``inproc``): the state dict itself, or on the ``ray`` backend a ref
    into Ray's object store (a ``ray.ObjectRef``; ray is an optional extra, so not named in the annotation)."""

    version: int
    weights: dict[str, torch.Tensor] | Any


@dataclass(frozen=True)
class Take:
    """Hold ``version``, whose weights arrive over the trainer's group (``dist``): wait for them if needed."""

    version: int


@dataclass(frozen=True)
class Load:
    """Have the engine load ``version`` through its own weight-transfer API (``vllm``); the engine then holds
    that version only."""

    version: int


@dataclass(frozen=True)
class Keep:
    """Forget every held version not in ``versions`` (no pending batch is generated with one)."""

    versions: tuple[int, ...]


WeightMessage = Put | Take | Load | Keep
