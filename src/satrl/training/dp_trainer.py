"""The data-parallel trainer: a one-device :class:`~satrl.training.trainer.Trainer` on the
:class:`~satrl.training.sharded.Sharded` placement, whose calls that need the other ranks are announced first.

Every rank builds one (rank 0 announces :class:`~satrl.training.dp_calls.Start` first, so the others build theirs
in step). On rank 0 the training loop calls it as it calls a :class:`Trainer`: each call that needs the others
becomes an entry of :data:`~satrl.training.dp_calls.CALLS`, announced on the control channel, then run on the
inner trainer. The other ranks run :meth:`DPTrainer.serve`: the same entries, on their own inner trainers. The
batch loop (:mod:`satrl.training.batch_loop`) runs on rank 0 through this class, so each of its steps and
forwards is announced; the inner trainer never knows it is sharded, nor which rank it is on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch

from satrl.dtypes import dtype_name
from satrl.objectives.step_size import advantage_rule
from satrl.training import dp as dpm
from satrl.training import dp_calls as calls
from satrl.training.batch_loop import Snapshots, train_batch, version_logp
from satrl.training.settings import TrainerSettings
from satrl.training.sharded import Sharded
from satrl.training.trainer import Trainer
from satrl.types import Batch
from satrl.weights.buckets import Bucket


class DPTrainer:
    """A :class:`Trainer` whose policy (and reference) are sharded with FSDP2 over ``dp.mesh``.

    Extra arguments: ``dp`` (this process's :class:`~satrl.training.dp.DataParallel`), ``template`` (builds
    an unsharded copy of the policy, for an engine to copy). Everything else as :class:`Trainer`."""

    def __init__(self, model: torch.nn.Module, objective, settings: TrainerSettings, *, dp: dpm.DataParallel,
                 template: Callable[[], torch.nn.Module]) -> None:  # fmt: skip
        if advantage_rule(objective) is not None:  # every rank refuses, before any collective
            raise ValueError("data parallel: the objective's advantage baseline (vcpo's baseline=opob) needs "
                             "per-sequence gradients, which the sharded trainer does not compute")
        self.dp = dp
        if dp.leader:
            calls.announce(dp.channel, calls.Start())
        # From Start on the others build the same trainer, inside collectives: a failure here must end this
        # process (torchrun then stops them), not send them a Stop they cannot receive (a silent deadlock).
        dp.busy = True
        self.trainer = Trainer(model, objective, replace(settings, device=dp.device), Sharded(dp, template))
        dp.busy = False

    def serve(self) -> None:
        """Ranks > 0: run rank 0's announced calls on this rank's trainer until it stops."""
        calls.serve(self.dp.channel, self.trainer)

    def _call(self, call):
        """Rank 0: announce ``call``, then run it here. While inside, an error must not release the others with
        a Stop (they are in a collective), so ``dp.busy`` stays set if it raises."""
        calls.announce(self.dp.channel, call)
        self.dp.busy = True
        result = call.run(self.trainer)
        self.dp.busy = False
        return result

    # -- what the loop reads, from the inner trainer -------------------------------------------------
    @property
    def settings(self) -> TrainerSettings:
        return self.trainer.settings

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    @property
    def needs_old_logp(self) -> bool:
        return self.trainer.needs_old_logp

    @property
    def version(self) -> int:
        return self.trainer.version

    @version.setter
    def version(self, value: int) -> None:
        self.trainer.version = value

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.trainer.advantages(batch)  # GRPO's group advantages (a baseline is refused): no collective

    def state_dict(self) -> dict:
        return self.trainer.state_dict()  # version and counters; model and optimizer go to the shards

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state)

    def engine_model(self) -> torch.nn.Module:
        return self.trainer.engine_model()

    # -- calls the others join -----------------------------------------------------------------------
    def train_batch(self, batch: Batch, index: int, snapshots: Snapshots, stop_at: int
                    ) -> Iterator[tuple[dict[str, float], torch.Tensor]]:  # fmt: skip
        return train_batch(self, batch, index, snapshots, stop_at)

    def version_logp(self, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:
        return version_logp(self, mb, snapshots)

    def step(self, mb: Batch, adv: torch.Tensor, old_logp=None, version_logp=None) -> dict[str, float]:
        return self._call(calls.Step(mb, adv, old_logp, version_logp, self.version))

    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:
        """Every rank runs every microbatch, so that the FSDP forwards line up and every rank gets the result."""
        return self._call(calls.Logp(mb, state))

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights on CPU (gathered once per version, announced only then)."""
        if self.trainer.weights_held():
            return self.trainer.weights()
        return self._call(calls.Gather(self.version))

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """Consume it to the end: the others are in its collectives."""
        call = calls.Buckets(dtype_name(dtype) if dtype is not None else "", bucket_bytes)
        calls.announce(self.dp.channel, call)
        self.dp.busy = True
        yield from call.run(self.trainer)
        self.dp.busy = False

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self._call(calls.LoadWeights(weights))

    def write_shards(self, path: Path) -> None:
        self._call(calls.Save(str(path)))

    def read_shards(self, path: Path) -> None:
        self._call(calls.Load(str(path), self.version, self.trainer.skipped))


__all__ = ["DPTrainer"]
