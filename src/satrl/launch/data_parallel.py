"""Which rank does what in a data-parallel run (``torchrun --nproc_per_node=N -m satrl train ...``), and what
rank 0 tells the others (SPMD; nothing at all on one process).

Every rank runs the same training loop (:func:`satrl.loop.orchestrator.train`) on the same trainer (a plain
:class:`~satrl.training.trainer.Trainer` over the :class:`~satrl.training.sharded.Sharded` placement), so its
steps, forwards and checkpoint shards are collectives that line up by construction. What only rank 0 does (the
run directory's files, the engine, the evaluator, the snapshot store) sits behind the objects the loop calls,
which on the other ranks are stand-ins (:mod:`satrl.launch.stand_ins`) that do nothing or receive what
rank 0 broadcasts. The loop holds the channel (:func:`following`: :class:`Leader` on rank 0, :class:`Follower`
elsewhere, :class:`OneProcess` on one process), which goes over the control group, whose long timeout covers the
others' wait while rank 0 generates and evaluates (docs/design.md "Data parallel"):

- the **plan**, once every rank has built its trainer: the run starts from a checkpoint (every rank then loads
  its shards with rank 0) at a given batch, or from scratch; or rank 0 refused it (a resume check failed), and
  the others exit 0;
- each **batch**, collated, with its index and the weight versions the snapshot store holds (the Δπ/Δimpl split
  runs one forward per version it holds, rank 0's weights swapped into every rank's shards, and stops at the
  first it lacks: the others must run exactly the same forwards);
- at each **sync point** (the start, after each optimizer step, at each batch's end) the trainer's version (at
  the start the checkpoint's; every rank's from then on) and whether every rank gathers the weights now. Whether
  rank 0 reads a version's weights before the next sync point depends on what only it knows (the snapshot store
  keeps a version only while a pending batch needs it, an evaluation is due, a checkpoint): it decides, the
  others follow, and rank 0's trainer keeps the copy for that version. Asking for the weights anywhere else is
  refused (``Sharded.weights``), never a hang.

A rank 0 that fails anywhere but before the plan exits non-zero and torchrun ends the others (they wait in a
broadcast or a collective it will never reach); a stopped rank is the ranks' ``Watchdog``'s (``satrl.training.dp``).
Settings data parallel does not support are refused here (:func:`check_supported`), on every rank, before any
process group exists: one line naming the setting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from satrl.config.run import RunConfig
from satrl.config_base import ConfigError
from satrl.training import dp
from satrl.training.trainer import Trainer
from satrl.types import Batch

GATHER = 1  # a sync point's flag: every rank gathers the weights
GO, REFUSED = 1, 0  # the plan
BATCH = 1  # the head of a batch's broadcast
BATCH_FIELDS = ("input_ids", "attention_mask", "prompt_len", "mask", "response_ids", "behavior_logp", "versions",
                "rewards", "group_index", "routing")  # fmt: skip


def check_supported(cfg: RunConfig) -> None:
    """Refuse (one line naming the setting) what data parallel does not do yet."""
    if cfg.r3:
        raise ConfigError("r3=true is not supported under data parallel (torchrun) yet; run it on one process")
    if not (cfg.train.device == "cpu" or cfg.train.device.startswith("cuda")):
        raise ConfigError(f"train.device={cfg.train.device}: data parallel runs on cpu (gloo) or cuda (NCCL)")


def run(cfg: RunConfig, train: Callable[[dp.DataParallel], object]) -> object:
    """Run this process's part of a data-parallel job: ``train(ctx)`` (the training loop, given this process's
    place in the job), on every rank. Returns the loop's result on rank 0 (None elsewhere, and where rank 0
    refused the run before its plan)."""
    check_supported(cfg)
    ctx = dp.init(cfg.train.device, cfg.train.rank_timeout_s, cfg.run_dir())
    try:
        return train(ctx)
    except Refused:
        return None  # rank 0 said why
    finally:
        sys.stdout.flush()
        dp.shutdown(ctx)


def following(ctx: dp.DataParallel | None) -> Ranks:
    """The channel between this rank and the others (``ctx``: this process's place in the job, None on one
    process): :class:`OneProcess`, :class:`Leader` on rank 0, :class:`Follower` elsewhere."""
    if ctx is None:
        return OneProcess()
    return Leader(ctx) if ctx.leader else Follower(ctx)


class Refused(Exception):
    """Rank 0 refused the run before its plan (it says why): the other ranks end quietly."""


class Plan(NamedTuple):
    """What rank 0 tells the others once every trainer is built: whether the run resumes, and from which batch."""

    resume: bool
    next_batch: int


def gather_weights(trainer: Trainer) -> None:
    """Every rank at once: gather this version's full weights. Rank 0's trainer keeps the copy for the version
    (:meth:`WeightExport.weights`), so that whatever reads them before the next step gets it without a collective."""
    with trainer.placement.gathering():
        trainer.export.weights()


class OneProcess:
    """No other ranks: the loop tells nobody anything, and pays nothing for it."""

    ctx = None  # no data-parallel context
    rank0 = True  # this process runs the run directory, the engine and the evaluator

    def built(self) -> None:
        pass

    def start(self, resume: bool, next_batch: int) -> None:
        pass

    def train(self, batch: Batch, index: int, held: Iterable[int]) -> None:
        pass

    def sync(self, trainer: Trainer, gather: bool) -> None:
        pass

    def release(self) -> None:
        pass


class Leader(OneProcess):
    """Rank 0: tells the others (:class:`Follower`) what only it knows, where they wait for it (module docstring)."""

    def __init__(self, ctx: dp.DataParallel) -> None:
        self.ctx = ctx
        self.waiting = False  # the others wait for the plan: every rank's trainer is built (built)
        self.planned = False  # ... until it is sent (or rank 0 refuses the run)

    def built(self) -> None:
        """Every rank's trainer is built, in the same collectives: the others now wait for the plan."""
        self.waiting = True

    def start(self, resume: bool, next_batch: int) -> None:
        """The plan: the run goes on from the checkpoint rank 0 loads next (``resume``) at batch ``next_batch``,
        or from scratch."""
        dp.broadcast_ints(self.ctx, [GO, int(resume), next_batch], 3)
        self.planned = True

    def release(self) -> None:
        """Rank 0's loop failed. If the others wait for the plan (it refused the run), they exit quietly. Anywhere
        else they are in a collective or a broadcast this process will never reach (building the trainer, or
        training): it exits non-zero, and torchrun ends them."""
        if self.waiting and not self.planned:
            dp.broadcast_ints(self.ctx, [REFUSED, 0, 0], 3)
            self.planned = True

    def train(self, batch: Batch, index: int, held: Iterable[int]) -> None:
        """Every rank trains rollout batch ``index`` (the snapshot store holding versions ``held``)."""
        head = torch.tensor([BATCH, index], dtype=torch.int64)
        kept = torch.tensor(sorted(held), dtype=torch.int64)
        dp.broadcast_tensors(self.ctx, [head, kept, *(getattr(batch, f) for f in BATCH_FIELDS)])

    def sync(self, trainer: Trainer, gather: bool) -> None:
        """A sync point: every rank takes this trainer's version, and gathers the weights now if ``gather`` (this
        rank reads them before the next sync point)."""
        dp.broadcast_ints(self.ctx, [GATHER if gather else 0, trainer.version], 2)
        if gather:
            gather_weights(trainer)


class Received(NamedTuple):
    """A batch as the other ranks receive it, with the versions rank 0's snapshot store holds (``held``)."""

    batch: Batch
    index: int
    held: set[int]


class Follower(OneProcess):
    """Ranks > 0: wait for rank 0 where only it knows what comes next (module docstring); the loop's stand-ins
    (:mod:`satrl.launch.stand_ins`) read the plan and the batches from here."""

    rank0 = False

    def __init__(self, ctx: dp.DataParallel) -> None:
        self.ctx = ctx
        self.plan: Plan | None = None

    def built(self) -> None:
        """Every rank's trainer is built: wait for the plan (:class:`Refused` if rank 0 refused the run)."""
        go, resume, next_batch = dp.broadcast_ints(self.ctx, None, 3)
        if go != GO:
            raise Refused("rank 0 refused the run")
        self.plan = Plan(bool(resume), next_batch)

    def batch(self) -> Received:
        """The next batch to train."""
        head, *rest = dp.broadcast_tensors(self.ctx, None)
        _, index = head.tolist()
        fields = rest[1:]
        return Received(Batch(**dict(zip(BATCH_FIELDS, fields))), index, set(rest[0].tolist()))

    def sync(self, trainer: Trainer, gather: bool) -> None:
        """A sync point: do what rank 0 says (:meth:`Leader.sync`; ``gather``, which only rank 0 knows, is unused). Its
        version first, so that every rank's trainer keeps its gathered copy (``{}`` here) under the same version,
        and steps at the same lag."""
        flags, trainer.version = dp.broadcast_ints(self.ctx, None, 2)
        if flags & GATHER:
            gather_weights(trainer)


Ranks = OneProcess  # what the loop holds (following): the other ranks as this one sees them
