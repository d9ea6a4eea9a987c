"""One rollout batch, trained: advantages, pi_old, the per-version log-probs, then ``ppo_epochs`` passes of
``minibatches`` optimizer steps.

These are functions of any :class:`Steps` (:class:`~satrl.training.trainer.Trainer` is one), kept apart from the
trainer's step so that the loop over a rollout batch reads in one place. Under data parallel every rank runs
this same loop on its own trainer (SPMD), so its steps' and forwards' collectives line up by construction; what
rank 0 alone knows (the batch, which weight versions its snapshot store holds) it broadcasts first
(:mod:`satrl.launch.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from satrl.training.microbatches import epoch_order, pick, split_rows
from satrl.training.settings import TrainerSettings
from satrl.types import Batch

Snapshots = Callable[[int], "dict[str, torch.Tensor] | None"]


class Steps(Protocol):
    """What the batch loop calls on a trainer."""

    settings: TrainerSettings
    version: int  # optimizer-step slots taken so far
    needs_old_logp: bool  # a correction or the recomputed denominator reads pi_old

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-row advantages [B] and the metrics of the baseline that made them."""
        ...

    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:
        """Log-probs [B, T] under a snapshot's weights, or the current ones (``state`` None)."""
        ...

    def step(self, mb: Batch, adv: torch.Tensor, old_logp: torch.Tensor | None = None,
             version_logp: torch.Tensor | None = None) -> dict[str, float]:  # fmt: skip
        """One optimizer step over minibatch ``mb``; its metrics."""
        ...


def train_batch(t: Steps, batch: Batch, index: int, snapshots: Snapshots, stop_at: int
                ) -> Iterator[tuple[dict[str, float], torch.Tensor]]:  # fmt: skip
    """Train rollout batch number ``index``: everything the trainer does with it, in order.

    1. advantages (GRPO's group advantages, or the objective's own baseline);
    2. pi_old, the trainer's own log-probs before the batch, when a correction or the recomputed
       denominator needs it;
    3. for the d = Delta_pi + Delta_impl split (``settings.decompose``), the log-probs under each sample's own
       weight version (``snapshots``: version -> weights);
    4. ``ppo_epochs`` passes, each a seeded permutation of the rows cut into ``minibatches`` optimizer steps.

    Yields ``(metrics, rows)`` after every optimizer step, so that the loop can push weights, log and
    evaluate between steps; stops as soon as the version reaches ``stop_at`` (the run's last step).
    """
    s = t.settings
    adv, batch_metrics = t.advantages(batch)
    old_logp = t.logp_with(None, batch) if t.needs_old_logp else None
    vlogp = version_logp(t, batch, snapshots) if s.decompose else None
    for epoch in range(s.ppo_epochs):
        if t.version >= stop_at:
            return
        for rows in torch.tensor_split(epoch_order(s.seed, index, epoch, batch.mask.shape[0]), s.minibatches):
            metrics = t.step(split_rows(batch, rows), adv[rows], pick(old_logp, rows), pick(vlogp, rows))
            metrics.update(batch_metrics)
            yield metrics, rows
            if t.version >= stop_at:
                return


@torch.no_grad()
def version_logp(t: Steps, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:  # [B, T]
    """log pi^(l) for each token's own version l (for the d = Delta_pi + Delta_impl split): one forward per
    version present, each token picking its own. A row sampled by one version takes that forward whole, as
    before in-flight updates; padding counts as the row's newest version. None if a version is not kept."""
    out = torch.zeros(mb.mask.shape)
    row_version = torch.where(mb.mask, mb.versions, mb.versions.min()).max(1).values
    token_version = torch.where(mb.mask, mb.versions, row_version[:, None])  # [B, T]
    for v in token_version.unique().tolist():
        state = snapshots(int(v))
        if state is None:
            return None
        rows = (token_version == v).any(1).nonzero().squeeze(1)
        lp = t.logp_with(state, split_rows(mb, rows))
        out[rows] = torch.where(token_version[rows] == v, lp, out[rows])
    return out
