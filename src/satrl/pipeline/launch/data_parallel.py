"""Which rank does what in a data-parallel run (``torchrun --nproc_per_node=N -m satrl train ...``), and what
rank 0 tells the others (SPMD; nothing at all on one process).

Every rank builds the same trainer (a plain :class:`~satrl.training.trainer.Trainer` over the
:class:`~satrl.training.sharded.Sharded` placement) and trains every batch with the same batch loop
(:func:`satrl.training.batch_loop.train_batch`), so its steps and forwards are collectives that line up by
construction. Rank 0 runs the training loop as on one device (:func:`satrl.pipeline.orchestrator.train`: the
engine, the run directory, the evaluator, the snapshot store); every other rank runs :func:`follow`, the same loop
without its I/O. What only rank 0 knows, it broadcasts to them (:class:`Leader` to :class:`Follower`, over the
control group, whose long timeout covers their wait while it generates and evaluates; docs/design.md "Data
parallel"):

- the **plan**, once every rank has built its trainer: the run starts from a checkpoint (every rank then loads
  its shards with rank 0) or from scratch; or rank 0 refused it (a resume check failed), and the others exit 0;
- each **batch**, collated, with its index and the weight versions the snapshot store holds (the Δπ/Δimpl split
  runs one forward per version it holds, rank 0's weights swapped into every rank's shards, and stops at the
  first it lacks: the others must run exactly the same forwards);
- at each **sync point** (the start, after each optimizer step, at each batch's end) the trainer's version (at
  the start the checkpoint's; every rank's from then on), whether every rank gathers the weights now, and
  whether a checkpoint's shards follow. Whether rank 0 reads a version's weights before the next sync point
  depends on what only it knows (the snapshot store keeps a version only while a pending batch needs it, an
  evaluation is due, a checkpoint): it decides, the others follow, and rank 0's trainer keeps the copy for that
  version. Asking for the weights anywhere else is refused (``Sharded.weights``), never a hang.

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

from satrl.config_base import ConfigError
from satrl.dtypes import set_tf32
from satrl.pipeline.launch.setup import build_trainer
from satrl.pipeline.run_config import RunConfig
from satrl.training import dp
from satrl.training.trainer import Trainer
from satrl.types import Batch

GATHER, SHARDS = 1, 2  # a sync point's flags: every rank gathers the weights; every rank writes its shards
GO, REFUSED = 1, 0  # the plan
BATCH, END = 1, 0  # what rank 0 sends where the others wait for the next batch
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
    place in the job) on rank 0, :func:`follow` elsewhere. Returns the loop's result (None elsewhere)."""
    check_supported(cfg)
    ctx = dp.init(cfg.train.device, cfg.train.rank_timeout_s, cfg.run_dir())
    try:
        if not ctx.leader:
            follow(cfg, ctx)
            return None
        return train(ctx)
    finally:
        sys.stdout.flush()
        dp.shutdown(ctx)


def follow(cfg: RunConfig, ctx: dp.DataParallel) -> None:
    """Ranks > 0: build the same trainer as rank 0 (inside the same collectives), then run its loop
    (``orchestrator._train``) without the I/O: the plan (rank 0's refusal ends it here), the checkpoint's shards if
    the run resumes, the start's sync point, and for each batch rank 0 sends the same ``train_batch``, with a sync
    point after each optimizer step and at the batch's end; until rank 0's loop is over. A failure of rank 0 in
    between ends this process through torchrun."""
    torch.set_num_threads(cfg.trainer_threads)
    set_tf32(cfg.train.tf32)
    torch.manual_seed(cfg.seed)
    trainer, _ = build_trainer(cfg, ctx)
    leader = Follower(ctx)
    resume = leader.plan()
    if resume is None:
        return  # rank 0 refused the run before training
    if resume:  # in rank 0's order (orchestrator._resume); its version comes with the next sync point
        trainer.export.load({})
        trainer.export.read_shards(None)
    leader.sync(trainer)  # the start: the version the run starts from
    while (got := leader.batch()) is not None:
        for _ in trainer.train_batch(got.batch, got.index, got.snapshots, stop_at=cfg.steps):
            leader.sync(trainer)  # after each optimizer step
        leader.sync(trainer)  # the batch's end: its checkpoint


def following(ctx: dp.DataParallel | None) -> OneProcess | Leader:
    """The other ranks as rank 0's loop sees them (``ctx``: this process's place in the job, None on one
    process): a :class:`Leader`, or :data:`ONE_PROCESS`."""
    if ctx is None:
        return ONE_PROCESS
    if not ctx.leader:
        raise RuntimeError("data parallel: only rank 0 runs the training loop; the others follow it")
    return Leader(ctx)


def gather_weights(trainer: Trainer) -> None:
    """Every rank at once: gather this version's full weights. Rank 0's trainer keeps the copy for the version
    (:meth:`WeightExport.weights`), so that whatever reads them before the next step gets it without a collective."""
    with trainer.placement.gathering():
        trainer.export.weights()


class OneProcess:
    """No other ranks: the loop tells nobody anything, and pays nothing for it."""

    ctx = None  # no data-parallel context

    def built(self) -> None:
        pass

    def start(self, resume: bool) -> None:
        pass

    def train(self, batch: Batch, index: int, held: Iterable[int]) -> None:
        pass

    def sync(self, trainer: Trainer, gather: bool, shards: bool = False) -> None:
        pass

    def release(self) -> None:
        pass

    def end(self) -> None:
        pass


ONE_PROCESS = OneProcess()


class Leader:
    """Rank 0: tells the others (:class:`Follower`) what only it knows, where they wait for it (module docstring)."""

    def __init__(self, ctx: dp.DataParallel) -> None:
        self.ctx = ctx
        self.waiting = False  # the others wait for the plan: every rank's trainer is built (built)
        self.planned = False  # ... until it is sent (or rank 0 refuses the run)

    def built(self) -> None:
        """Every rank's trainer is built, in the same collectives: the others now wait for the plan."""
        self.waiting = True

    def start(self, resume: bool) -> None:
        """The plan: the run goes on from the checkpoint rank 0 loads next (``resume``), or from scratch."""
        dp.broadcast_ints(self.ctx, [GO, int(resume)], 2)
        self.planned = True

    def release(self) -> None:
        """Rank 0's loop failed. If the others wait for the plan (it refused the run), they exit quietly. Anywhere
        else they are in a collective or a broadcast this process will never reach (building the trainer, or
        training): it exits non-zero, and torchrun ends them."""
        if self.waiting and not self.planned:
            dp.broadcast_ints(self.ctx, [REFUSED, 0], 2)
            self.planned = True

    def train(self, batch: Batch, index: int, held: Iterable[int]) -> None:
        """Every rank trains rollout batch ``index`` (the snapshot store holding versions ``held``)."""
        head = torch.tensor([BATCH, index], dtype=torch.int64)
        kept = torch.tensor(sorted(held), dtype=torch.int64)
        dp.broadcast_tensors(self.ctx, [head, kept, *(getattr(batch, f) for f in BATCH_FIELDS)])

    def end(self) -> None:
        """The loop is over: the others stop waiting for a batch."""
        dp.broadcast_tensors(self.ctx, [torch.tensor([END, 0], dtype=torch.int64)])

    def sync(self, trainer: Trainer, gather: bool, shards: bool = False) -> None:
        """A sync point: every rank takes this trainer's version, gathers the weights now if ``gather`` (this rank
        reads them before the next sync point), and writes its shards into the checkpoint that follows if ``shards``."""
        flags = (GATHER if gather else 0) | (SHARDS if shards else 0)
        dp.broadcast_ints(self.ctx, [flags, trainer.version], 2)
        if gather:
            gather_weights(trainer)


class Received(NamedTuple):
    """A batch as the other ranks receive it, with ``snapshots``, which gives ``{}`` (rank 0's weights come inside
    the swap's collectives) for a version rank 0's store holds, else None."""

    batch: Batch
    index: int
    snapshots: Callable[[int], dict | None]


class Follower:
    """Ranks > 0: wait for rank 0 where only it knows what comes next (:func:`follow`)."""

    def __init__(self, ctx: dp.DataParallel) -> None:
        self.ctx = ctx

    def plan(self) -> bool | None:
        """Whether the run resumes from a checkpoint; None if rank 0 refused it."""
        go, resume = dp.broadcast_ints(self.ctx, None, 2)
        return bool(resume) if go == GO else None

    def batch(self) -> Received | None:
        """The next batch to train, or None when rank 0's loop is over."""
        head, *rest = dp.broadcast_tensors(self.ctx, None)
        kind, index = head.tolist()
        if kind == END:
            return None
        held, fields = set(rest[0].tolist()), rest[1:]
        batch = Batch(**dict(zip(BATCH_FIELDS, fields)))
        return Received(batch, index, lambda v: {} if v in held else None)

    def sync(self, trainer: Trainer) -> None:
        """A sync point: do what rank 0 says (:meth:`Leader.sync`). Its version first, so that every rank's trainer
        keeps its gathered copy (``{}`` here) under the same version, and steps at the same lag."""
        flags, trainer.version = dp.broadcast_ints(self.ctx, None, 2)
        if flags & GATHER:
            gather_weights(trainer)
        if flags & SHARDS:
            trainer.export.write_shards(None)  # rank 0 names the folder when its checkpoint gets there


Followers = OneProcess | Leader  # what rank 0's loop holds (following)
