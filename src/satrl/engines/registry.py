"""Engine registry: the one place where an engine name becomes a class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from satrl.engines.torch_engine import TorchEngine
from satrl.types import Engine

ENGINES: dict[str, Callable[..., Engine]] = {
    "torch": TorchEngine,
}


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine ``name`` (e.g. ``make_engine("torch", model=m, eos_token_id=1, pad_token_id=0)``)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid choices: {sorted(ENGINES)}")
    return ENGINES[name](**kwargs)
