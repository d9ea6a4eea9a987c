"""Weights out of the trainer as a stream of buckets: each a few hundred MiB of flat tensors in the dtype the
engine holds, cast parameter by parameter from the model, so no full copy of the weights (let alone an fp32 one)
is made on the host for them. Under data parallel the trainer cuts them instead from the fp32 copy that every
rank gathered together at a sync point (:func:`copy_buckets`; docs/design.md, "Data parallel").

A **bucket** is one flat 1-D tensor plus the names and shapes of the tensors packed into it, in order. Tied
parameters (Qwen3's shared input embedding and LM head) travel once: the stream's end names the aliases and the
receiver points them at the one copy. The stream is what a transport sends (`satrl.weights.link`); an engine
rebuilds the state dict with :func:`unpack`.

Under FSDP2 every parameter is a ``DTensor``; ``full_tensor()`` all-gathers it, so *every* rank must walk the
stream together, in the same order (the state dict's), even though only rank 0 sends it on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from satrl.dtypes import dtype_name

__all__ = ["Bucket", "DEFAULT_BUCKET_BYTES", "aliases", "buckets", "copy_buckets", "state_aliases", "state_buckets",
           "unpack"]  # fmt: skip

DEFAULT_BUCKET_BYTES = 256 * 2**20  # large enough to amortise a collective, small next to any GPU's memory


@dataclass(frozen=True)
class Bucket:
    """``flat`` [sum of numels] holds the tensors ``names`` (shapes ``shapes``) back to back, in one dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    flat: torch.Tensor

    def header(self) -> dict:
        """What a receiver needs to allocate and split the bucket (JSON-able)."""
        dtype = dtype_name(self.flat.dtype)
        return {"names": list(self.names), "shapes": [list(s) for s in self.shapes], "dtype": dtype}

    def tensors(self) -> dict[str, torch.Tensor]:
        """name -> a view into ``flat`` with its shape (no copy)."""
        out, start = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            out[name] = self.flat[start : start + n].view(shape)
            start += n
        return out


def _storage_key(t: torch.Tensor) -> tuple:
    local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: its shard identifies it
    return (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.dtype)


def aliases(model: torch.nn.Module) -> dict[str, str]:
    """state-dict name -> the earlier name whose tensor it shares (tied weights), e.g.
    ``{"lm_head.weight": "model.embed_tokens.weight"}``. Those names are not streamed."""
    return state_aliases(model.state_dict(keep_vars=True))


def state_aliases(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """:func:`aliases` of a state dict: names whose tensor shares storage, offset and shape with an earlier one."""
    first: dict[tuple, str] = {}
    out = {}
    for name, t in state.items():
        key = _storage_key(t)
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out


def buckets(model: torch.nn.Module, dtype: torch.dtype | None = torch.bfloat16,
            bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Bucket]:  # fmt: skip
    """The model's state dict (aliases once) as buckets of at most ``bucket_bytes`` in ``dtype`` on the CPU (a
    single larger tensor gets a bucket of its own). ``dtype=None`` keeps each tensor's dtype; only floating
    tensors are cast, and a bucket is cut where the dtype changes. Gathers sharded (DTensor) entries one at a
    time: collective, so every rank iterates."""
    skip = aliases(model)
    items = ((k, t.full_tensor() if hasattr(t, "full_tensor") else t) for k, t in model.state_dict().items() if k not in skip)
    return _pack(items, dtype, bucket_bytes)


def state_buckets(state: dict[str, torch.Tensor], dtype: torch.dtype | None = torch.bfloat16,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Bucket]:  # fmt: skip
    """:func:`buckets` of a state dict already on the host (a kept snapshot); aliases (:func:`state_aliases`)
    once. A dict whose tied entries are separate copies (``WeightExport.weights``) sends both. Tensors that already
    lie back to back in one storage of ``dtype`` (a snapshot rebuilt by :func:`unpack`) are sent as a view of
    it, without a copy: a snapshot never changes, unlike a model's parameters."""
    skip = state_aliases(state)
    return _pack(((k, t) for k, t in state.items() if k not in skip), dtype, bucket_bytes, share=True)


def copy_buckets(state: dict[str, torch.Tensor], tied: dict[str, str], dtype: torch.dtype | None = torch.bfloat16,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Bucket]:  # fmt: skip
    """:func:`buckets` of a model, from a full copy of its state dict already on the host (``WeightExport.weights``,
    whose tied entries are separate tensors): the model's aliases ``tied`` (:func:`aliases`) left out, as
    :func:`buckets` leaves them, so the same stream and the same :func:`unpack`."""
    return state_buckets({k: t for k, t in state.items() if k not in tied}, dtype, bucket_bytes)


def _pack(items: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype | None, bucket_bytes: int,
          share: bool = False) -> Iterator[Bucket]:  # fmt: skip
    names: list[str] = []
    parts: list[torch.Tensor] = []
    size, kind = 0, None
    for name, t in items:
        t = t.detach()
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype  # integer buffers keep theirs
        nbytes = t.numel() * cast.itemsize
        if parts and (size + nbytes > bucket_bytes or cast != kind):
            yield _bucket(names, parts, kind, share)
            names, parts, size = [], [], 0
        names.append(name)
        parts.append(t)
        size, kind = size + nbytes, cast
    if parts:
        yield _bucket(names, parts, kind, share)


def _bucket(names: list[str], parts: list[torch.Tensor], dtype: torch.dtype, share: bool) -> Bucket:
    flat = _span(parts, dtype) if share else None
    if flat is None:
        flat = torch.empty(sum(p.numel() for p in parts), dtype=dtype)
        start = 0
        for p in parts:  # one pass per tensor: the cast and the move to the CPU happen inside copy_
            flat[start : start + p.numel()].view(p.shape).copy_(p)
            start += p.numel()
    return Bucket(tuple(names), tuple(tuple(p.shape) for p in parts), flat)


def _span(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
    """``parts`` as one flat view when they lie back to back in one CPU storage of ``dtype``; else None."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    end = first.storage_offset()
    for p in parts:
        if (p.device.type != "cpu" or p.dtype != dtype or not p.is_contiguous()
                or p.untyped_storage().data_ptr() != storage or p.storage_offset() != end):  # fmt: skip
            return None
        end += p.numel()
    return first.as_strided((end - first.storage_offset(),), (1,))


def unpack(stream: list[Bucket] | Iterator[Bucket], tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """The full state dict from a stream's buckets and its aliases: every name, tied ones sharing a tensor."""
    state: dict[str, torch.Tensor] = {}
    for bucket in stream:
        state.update(bucket.tensors())
    for name, target in tied.items():
        if target not in state:
            raise KeyError(f"weights stream: {name!r} is tied to {target!r}, which the stream did not carry")
        state[name] = state[target]
    return state
