"""Weight sync between the trainer and the engine side: each version travels once, and requests name versions.

A rollout request never carries weights (:class:`~satrl.pipeline.worker.RolloutRequest`). Instead the loop's
:class:`~satrl.pipeline.rollouts.Rollouts` pushes a version's weights to the backend once, when the snapshot store
keeps it, and tells the backend which versions it still keeps when it forgets one; the engine side holds exactly
those (:meth:`RolloutWorker.put`, :meth:`RolloutWorker.keep`). A batch whose version the engine side does not hold
fails with :class:`~satrl.pipeline.worker.WeightsMissing`, never silently runs on other weights.

``inproc`` (this module) is today's bytes path: a call in this process (``sequential``) or one pickled message on
the ``local`` backend's request queue. ``ray`` puts each version into Ray's object store once. Transports over a
``torch.distributed`` group or vLLM's weight-transfer API are meant to plug in here too (issue 28, step 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from satrl.pipeline.worker import RolloutRequest, RolloutWorker

Message = tuple  # ("weights", version, state) | ("keep", [versions]) | ("rollout", RolloutRequest)


class InprocTransport:
    """Feeds one engine worker through ``send`` (a message to :func:`receive` on the engine side) and mirrors
    what it holds, so that a restarted engine can be fed again (:meth:`replay`). The mirror shares the snapshot
    store's tensors: no copy on this side."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self.send = send
        self.held: dict[int, dict[str, torch.Tensor]] = {}

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.held[version] = state
        self.send(("weights", version, state))

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self.send(("keep", sorted(versions)))

    def replay(self) -> None:
        """Feed a fresh engine everything the lost one held, before any request is sent again."""
        for v in sorted(self.held):
            self.send(("weights", v, self.held[v]))


def receive(worker: RolloutWorker, message: Message) -> RolloutRequest | None:
    """Apply a weights or keep message to ``worker``; a rollout message returns its request (to run)."""
    kind, *body = message
    if kind == "weights":
        worker.put(body[0], body[1])
    elif kind == "keep":
        worker.keep(set(body[0]))
    elif kind == "rollout":
        return body[0]
    else:
        raise ValueError(f"unknown weight-sync message {kind!r}")
    return None


def payload_weights(obj: Any) -> bool:
    """Whether ``obj`` holds a tensor anywhere in its attributes (the check that requests carry no weights)."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(payload_weights(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(payload_weights(v) for v in obj)
    return hasattr(obj, "__dict__") and payload_weights(vars(obj))
