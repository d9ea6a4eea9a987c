"""From samples to padded batches, and the batch the loop takes. (The snapshot store that keeps the weights future
batches need is :mod:`satrl.weights.snapshot`, beside the snapshots it holds; ``buffer.SnapshotStore`` still works, warning once.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from satrl.tensors import scoring_slice
from satrl.types import Batch, Sample


@dataclass
class Taken:
    """The batch that trains next (its samples collated), and what the loop logs about getting them."""

    batch: Batch
    waited_s: float  # the trainer's wait for them
    dropped: int  # samples discarded for exceeding lag.max_staleness (on_stale=drop)
    held: int  # samples whose generation waited for fresher weights (on_stale=hold)
    timeouts: int  # samples whose grading hit the task's time limit (reward 0)


def collate(samples: list[Sample], pad_id: int) -> Batch:
    """Right-pad prompt+response rows into a :class:`Batch`. Routing [T, layers, k] of response token t is
    placed at input position ``prompt_len - 1 + t`` (``satrl.tensors.scoring_slice``), whose logits score token t."""
    B = len(samples)
    if B == 0:
        raise ValueError("cannot collate an empty batch (every sample was dropped?)")
    T = max(1, max(len(s.response_ids) for s in samples))
    L = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.bool)
    mask = torch.zeros(B, T, dtype=torch.bool)
    response = torch.zeros(B, T, dtype=torch.long)
    blp = torch.zeros(B, T)
    versions = torch.zeros(B, T, dtype=torch.long)
    routing = None
    if samples[0].routing is not None:
        _, layers, k = samples[0].routing.shape
        routing = torch.full((B, L, layers, k), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        p, t = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + t] = torch.tensor(s.prompt_ids + s.response_ids)
        attention[i, : p + t] = True
        mask[i, :t] = True
        response[i, :t] = torch.tensor(s.response_ids, dtype=torch.long)
        blp[i, :t] = s.behavior_logp.float()
        versions[i, :t] = s.versions() if s.token_versions is not None else s.version
        if routing is not None and s.routing is not None:
            routing[i, scoring_slice(p, t)] = s.routing.long()
    first_seen: dict[str, int] = {}
    group_index = torch.tensor([first_seen.setdefault(s.group_id, len(first_seen)) for s in samples])
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_len=torch.tensor([len(s.prompt_ids) for s in samples]),
        mask=mask,
        response_ids=response,
        behavior_logp=blp,
        versions=versions,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        group_index=group_index,
        routing=routing,
        sample_ids=[s.id for s in samples],
    )


def __getattr__(name: str) -> Any:
    if name == "SnapshotStore":  # its old home (issue 61): the alias warns once per process
        from satrl.moved import moved
        from satrl.weights.snapshot import SnapshotStore

        moved("satrl.pipeline.buffer.SnapshotStore", "satrl.weights.snapshot.SnapshotStore")
        return SnapshotStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
