"""Rank 0 tells the other ranks what to do next: a call's code, a few ints, a string and some tensors.

Under data parallel only rank 0 runs the loop (engine, run directory, evaluator); the other ranks wait here
for the next trainer call and then join its collectives (:mod:`satrl.training.dp_calls` says what each call
carries). Everything travels as
tensors broadcast over a gloo group (CPU, with a long timeout: the others wait while rank 0 generates or
evaluates), never as pickles: a header of fixed size, then the shapes and dtypes, then one byte buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from satrl.dtypes import WIRE

# Dtypes that may cross the channel, by code (the index). Append only.
MAX_DIMS = 6
_META = 2 + MAX_DIMS  # per tensor: dtype code (-1: None), ndim, shape


@dataclass
class Message:
    op: int
    ints: list[int] = field(default_factory=list)
    text: str = ""
    tensors: list[torch.Tensor | None] = field(default_factory=list)


def _meta(t: torch.Tensor | None) -> list[int]:
    if t is None:
        return [-1, 0] + [0] * MAX_DIMS
    if t.dim() > MAX_DIMS:
        raise ValueError(f"a tensor of {t.dim()} dims cannot cross the channel (at most {MAX_DIMS})")
    return [WIRE.index(t.dtype), t.dim(), *t.shape, *[0] * (MAX_DIMS - t.dim())]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


class Channel:
    """Broadcasts :class:`Message` s from rank 0 over ``group`` (gloo). Rank 0 calls :meth:`send`, the
    others :meth:`recv`, in the same order."""

    def __init__(self, group) -> None:
        self.group = group

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=0, group=self.group)
        return t

    def send(self, msg: Message) -> None:
        text = torch.tensor(list(msg.text.encode()), dtype=torch.uint8)
        data = [_bytes(t) for t in msg.tensors if t is not None]
        size = sum(x.numel() for x in data) + text.numel()
        self._bcast(torch.tensor([msg.op, len(msg.ints), len(msg.tensors), text.numel(), size], dtype=torch.int64))
        meta = [*msg.ints, *(v for t in msg.tensors for v in _meta(t))]
        if meta:
            self._bcast(torch.tensor(meta, dtype=torch.int64))
        if size:
            self._bcast(torch.cat([text, *data]))

    def recv(self) -> Message:
        op, n_ints, n_tensors, n_text, size = self._bcast(torch.zeros(5, dtype=torch.int64)).tolist()
        meta = self._bcast(torch.zeros(n_ints + n_tensors * _META, dtype=torch.int64)).tolist() if n_ints + n_tensors else []
        buf = self._bcast(torch.zeros(size, dtype=torch.uint8)) if size else torch.zeros(0, dtype=torch.uint8)
        text, at = bytes(buf[:n_text].tolist()).decode(), n_text
        tensors: list[torch.Tensor | None] = []
        for i in range(n_tensors):
            code, ndim, *shape = meta[n_ints + i * _META: n_ints + (i + 1) * _META]
            if code < 0:
                tensors.append(None)
                continue
            dtype, shape = WIRE[code], shape[:ndim]
            n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            tensors.append(buf[at: at + n].clone().view(dtype).reshape(shape))
            at += n
        return Message(op, meta[:n_ints], text, tensors)
