"""The calls rank 0 makes the other ranks join: one table that both announces and dispatches.

Under data parallel only rank 0 runs the loop (engine, run directory, evaluator). Every trainer call that
needs the other ranks (their shards take part in its collectives) is a frozen dataclass in :data:`CALLS`. Rank 0
announces it on the control channel (:mod:`satrl.training.dist_channel`), then runs it; every other rank
receives it and runs the same :meth:`run` on its own trainer, so the collectives line up by construction.

A call's fields are its wire form, read from their types (:func:`encode`, :func:`decode`):

- ``Batch``: its tensors; ``Tensor`` (a tensor or None): itself; ``int`` and ``bool``: an int; ``str``: the text
  (one per call);
- ``Weights`` (rank 0's full state dict, or None): only whether it is there. The other ranks get ``{}``: they
  take their shards of rank 0's tensors inside the call's collectives.

Adding a call is adding one dataclass to :data:`CALLS` (append: the code is the index).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from satrl.training.dist_channel import Channel, Message
from satrl.training.trainer import Trainer
from satrl.types import Batch

Tensor = typing.Optional[torch.Tensor]
Weights = typing.Optional[dict[str, torch.Tensor]]
BATCH_FIELDS = ("input_ids", "attention_mask", "prompt_len", "mask", "response_ids", "behavior_logp", "versions",
                "rewards", "group_index", "routing")  # fmt: skip


class Call(Protocol):
    """One entry of :data:`CALLS`: run on a rank's own trainer, on every rank."""

    def run(self, t: Trainer) -> object: ...


@dataclass(frozen=True)
class Start:
    """Rank 0 is building its trainer: build the same one (then serve)."""

    def run(self, t: Trainer) -> None:
        pass


@dataclass(frozen=True)
class Stop:
    """The run is over (or refused before training): stop serving."""

    def run(self, t: Trainer) -> None:
        pass


@dataclass(frozen=True)
class Step:
    """One optimizer step over a minibatch, at rank 0's version."""

    mb: Batch
    adv: Tensor
    old_logp: Tensor
    version_logp: Tensor
    version: int

    def run(self, t: Trainer) -> dict[str, float]:
        t.version = self.version
        return t.step(self.mb, self.adv, self.old_logp, self.version_logp)


@dataclass(frozen=True)
class Logp:
    """Log-probs under the current weights, or under rank 0's snapshot ``state``."""

    mb: Batch
    state: Weights

    def run(self, t: Trainer) -> torch.Tensor:
        return t.logp_with(self.state, self.mb)


@dataclass(frozen=True)
class Gather:
    """The full weights of ``version``, gathered from the shards (rank 0 keeps them)."""

    version: int

    def run(self, t: Trainer) -> dict[str, torch.Tensor]:
        t.version = self.version
        return t.weights()


@dataclass(frozen=True)
class Buckets:
    """The full weights as a stream of buckets in dtype ``dtype`` ("" for as held); a stream: every rank walks
    it to the end (its collectives are in the walk), rank 0 keeps the buckets."""

    dtype: str
    bucket_bytes: int

    def run(self, t: Trainer) -> Iterator:
        from satrl.dtypes import named_dtype

        return t.weight_buckets(named_dtype(self.dtype) if self.dtype else None, self.bucket_bytes)


@dataclass(frozen=True)
class LoadWeights:
    """Set the policy's weights from rank 0's full state dict."""

    weights: Weights

    def run(self, t: Trainer) -> None:
        t.load_weights(self.weights if self.weights is not None else {})


@dataclass(frozen=True)
class Save:
    """Every rank writes its shards into checkpoint folder ``path``."""

    path: str

    def run(self, t: Trainer) -> None:
        t.write_shards(Path(self.path))


@dataclass(frozen=True)
class Load:
    """Resume: rank 0's counters, then every rank reads its shards from checkpoint folder ``path``."""

    path: str
    version: int
    skipped: int

    def run(self, t: Trainer) -> None:
        t.load_state_dict({"version": self.version, "skipped": self.skipped})
        t.read_shards(Path(self.path))


CALLS: tuple[type, ...] = (Start, Step, Logp, Gather, Buckets, LoadWeights, Save, Load, Stop)


def _fields(cls: type) -> list[tuple[str, object]]:
    hints = typing.get_type_hints(cls, globalns={**globals(), "Batch": Batch})
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]


def encode(call) -> Message:
    """``call`` as a channel message: its code and its fields, as their types say (module docstring)."""
    ints, text, tensors = [], "", []
    for name, kind in _fields(type(call)):
        value = getattr(call, name)
        if kind is Batch:
            tensors += [getattr(value, f) for f in BATCH_FIELDS]
        elif kind == Tensor:
            tensors.append(value)
        elif kind == Weights:
            ints.append(value is not None)
        elif kind in (int, bool):
            ints.append(int(value))
        elif kind is str:
            text = value
        else:
            raise TypeError(f"{type(call).__name__}.{name}: no wire form for {kind}")
    return Message(CALLS.index(type(call)), ints, text, tensors)


def decode(msg: Message):
    """The call a channel message carries (:func:`encode`'s inverse; rank 0's ``Weights`` arrive as ``{}``)."""
    if not 0 <= msg.op < len(CALLS):
        raise RuntimeError(f"data parallel: unknown call {msg.op} from rank 0")
    cls, ints, tensors, values = CALLS[msg.op], iter(msg.ints), iter(msg.tensors), {}
    for name, kind in _fields(cls):
        if kind is Batch:
            values[name] = Batch(**{f: next(tensors) for f in BATCH_FIELDS})
        elif kind == Tensor:
            values[name] = next(tensors)
        elif kind == Weights:
            values[name] = {} if next(ints) else None
        elif kind in (int, bool):
            values[name] = kind(next(ints))
        else:
            values[name] = msg.text
    return cls(**values)


def announce(channel: Channel, call) -> None:
    """Rank 0: tell the others which call comes next."""
    channel.send(encode(call))


def serve(channel: Channel, trainer: Trainer) -> None:
    """Ranks > 0: run each call rank 0 announces on this rank's ``trainer`` until :class:`Stop`. A stream's
    result is walked to its end here (its collectives are in the walk)."""
    while not isinstance(call := decode(channel.recv()), Stop):
        result = call.run(trainer)
        if isinstance(result, Iterator):
            for _ in result:
                pass
