"""Weights once per version over a ``torch.distributed`` group: the trainer broadcasts its bucket stream
(`satrl.weights.buckets`), every engine worker in the group receives it and loads it. gloo on CPU, NCCL on GPU.

Wire format, per version, all broadcasts from ``src``: for each bucket a header (JSON, sent as its length then
its UTF-8 bytes) and the bucket's flat tensor as raw bytes (so any dtype travels, bf16 included, bit for bit);
then a closing header ``{"version": v, "aliases": {...}}``. Nothing is pickled. ``src`` is a rank *within*
``group`` (``group_src``), so a standalone two-process group works as well as a subgroup of a torchrun job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from satrl.dtypes import named_dtype
from satrl.weights.buckets import Bucket, unpack

__all__ = ["receive", "send"]

def _backend(group) -> str:
    """The group's backend name; a standalone group (a ``ProcessGroupGloo`` built on its own store, as the local
    backend's trainer-engine link is) is not in torch's registry of groups, and names itself."""
    try:
        return dist.get_backend(group)
    except ValueError:  # "not initialized in the world group map"
        if group is None:
            raise
        return group.name()


def _device(group) -> torch.device:
    """Where collectives of this group must put their tensors: the current GPU under NCCL, else the CPU."""
    if _backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _send_json(obj: dict, src: int, group) -> None:
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    dev = _device(group)
    dist.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=dev), group=group, group_src=src)
    dist.broadcast(data.to(dev), group=group, group_src=src)


def _recv_json(src: int, group) -> dict:
    dev = _device(group)
    n = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.broadcast(n, group=group, group_src=src)
    data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    dist.broadcast(data, group=group, group_src=src)
    return json.loads(data.cpu().numpy().tobytes().decode())


def send(version: int, stream: Iterable[Bucket], tied: dict[str, str], src: int = 0, group=None) -> int:
    """Broadcast one version's buckets (on the sending rank); returns the bytes sent. Holds one bucket at a
    time: the stream gathers the next only after this one is on the wire."""
    sent = 0
    dev = _device(group)
    for bucket in stream:
        _send_json({"bucket": bucket.header()}, src, group)
        dist.broadcast(bucket.flat.view(torch.uint8).to(dev), group=group, group_src=src)
        sent += bucket.flat.numel() * bucket.flat.element_size()
    _send_json({"version": version, "aliases": tied}, src, group)
    return sent


def receive(src: int = 0, group=None) -> tuple[int, dict[str, torch.Tensor]]:
    """(version, full state dict on the CPU) of the next version broadcast by ``src`` (on a receiving rank)."""
    got: list[Bucket] = []
    dev = _device(group)
    while True:
        msg = _recv_json(src, group)
        if "version" in msg:
            return int(msg["version"]), unpack(got, msg["aliases"])
        h = msg["bucket"]
        shapes = tuple(tuple(s) for s in h["shapes"])
        numel = sum(math.prod(s) for s in shapes)
        dtype = named_dtype(h["dtype"])
        raw = torch.empty(numel * dtype.itemsize, dtype=torch.uint8, device=dev)
        dist.broadcast(raw, group=group, group_src=src)
        got.append(Bucket(tuple(h["names"]), shapes, raw.cpu().view(dtype)))
