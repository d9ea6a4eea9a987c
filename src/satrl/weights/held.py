"""What the engine side holds of one version until a keep list drops it: a typed value, never a bare state dict or
a ``None`` that means "the engine has it already".

Each kind knows how to put an engine on its version (:meth:`Held.load`), so the worker that holds them never asks
which transport brought them:

- :class:`InMemory`: the state dict itself (``inproc`` on the ``sequential`` and ``local`` backends; ``dist``
  once the broadcast arrived);
- :class:`InObjectStore`: a ref into Ray's object store (the ``ray`` backend), fetched only when the engine is not
  on that version yet, so an actor whose engine already is never copies the weights;
- :class:`InEngine`: the engine loaded it through its own weight-transfer API (``vllm``); nothing is left to load.

Ray stays an optional import: only :class:`InObjectStore` and :func:`in_object_store` import it, when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from satrl.types import Engine


class Held(Protocol):
    """One held version's weights."""

    def load(self, engine: Engine, version: int) -> None:
        """Put ``engine`` on ``version`` (called only when it is not on it already)."""


@dataclass(frozen=True)
class InMemory:
    """The weights of a version as a state dict in this process."""

    state: dict[str, torch.Tensor]

    def load(self, engine: Engine, version: int) -> None:
        engine.load_weights(self.state, version)


@dataclass(frozen=True)
class InObjectStore:
    """A ref into Ray's object store: the driver put the version there once, every actor call passes the ref."""

    ref: Any  # a ray.ObjectRef (ray is an optional extra: not imported for the annotation)

    def load(self, engine: Engine, version: int) -> None:
        import ray

        engine.load_weights(ray.get(self.ref), version)


@dataclass(frozen=True)
class InEngine:
    """The engine holds the version itself (``vllm``: it loaded it through its own API when the ``Load`` came)."""

    def load(self, engine: Engine, version: int) -> None:
        if engine.version != version:  # it loaded a later one since: that forgot this one
            raise RuntimeError(f"the engine is on version {engine.version}, not {version}, which it loaded itself")


def in_object_store(state: dict[str, torch.Tensor]) -> InObjectStore:
    """How ``inproc`` carries a version on the ``ray`` backend: put into Ray's object store, once."""
    import ray

    return InObjectStore(ray.put(state))
