"""Which rank does what in a data-parallel run (``torchrun --nproc_per_node=N -m satrl train ...``).

Rank 0 runs the training loop as on one device, with a data-parallel trainer; every other rank serves that
trainer's calls (:mod:`satrl.training.dp`, docs/design.md "Data parallel"). Settings data parallel does not
support are refused here, on every rank, before any process group exists: one line naming the setting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from satrl.config import ConfigError, RunConfig
from satrl.training import dp
from satrl.training.dist_channel import Message


def check_supported(cfg: RunConfig) -> None:
    """Refuse (one line naming the setting) what data parallel does not do yet."""
    if cfg.r3:
        raise ConfigError("r3=true is not supported under data parallel (torchrun) yet; run it on one process")
    if not (cfg.train.device == "cpu" or cfg.train.device.startswith("cuda")):
        raise ConfigError(f"train.device={cfg.train.device}: data parallel runs on cpu (gloo) or cuda (NCCL)")
    from satrl.objectives.step_size import advantage_rule

    if advantage_rule(cfg.objective) is not None:
        raise ConfigError(f"objective {cfg.objective.name}: its advantage baseline needs per-sequence gradients, "
                          "which data parallel does not compute; run on one process (vcpo: or objective.baseline="
                          "group_mean)")  # fmt: skip


def trainer_factory(cfg: RunConfig) -> tuple[type, dict]:
    """The trainer class and its extra arguments: :class:`Trainer` on one device, else the data-parallel one
    with this process's context and a way to build an unsharded copy of the policy (for an engine)."""
    from satrl.training.trainer import Trainer

    ctx = dp.current()
    if ctx is None:
        return Trainer, {}
    from satrl.models import load_policy
    from satrl.training.dp_trainer import DPTrainer

    return DPTrainer, {"dp": ctx, "template": lambda: load_policy(cfg.model.source)[0]}


def load_policy_here(cfg: RunConfig):
    """``(model, tokenizer)`` for this process: the loaded policy on one device and on rank 0; on the other
    ranks of a data-parallel job, the architecture on the meta device (no weights read: the trainer fills
    their shards from rank 0's, so only rank 0's host ever holds the full weights)."""
    from satrl.models import empty_model, load_policy, load_tokenizer

    ctx = dp.current()
    if ctx is None or ctx.leader:
        return load_policy(cfg.model.source)
    return empty_model(cfg.model.source), load_tokenizer(cfg.model.source)


def serve(cfg: RunConfig) -> None:
    """Ranks > 0: wait for rank 0 to start the trainer, build the same one, then join each call it announces
    until it stops (or the job ends: torchrun stops every rank when one fails)."""
    from satrl.pipeline.setup import build_trainer

    ctx = dp.current()
    torch.set_num_threads(cfg.trainer_threads)
    torch.manual_seed(cfg.seed)
    msg = ctx.channel.recv()
    if msg.op != dp.START:
        return  # dp.STOP: rank 0 refused the run before training began
    trainer, _ = build_trainer(cfg)
    while (msg := ctx.channel.recv()).op != dp.STOP:
        trainer.follow(msg)


def run(cfg: RunConfig, leader_run: Callable[[], object]) -> object:
    """Run this process's part of a data-parallel job: ``leader_run()`` (the training loop) on rank 0,
    :func:`serve` elsewhere. Returns the leader's result (None elsewhere)."""
    check_supported(cfg)
    ctx = dp.init(cfg.train.device, cfg.train.rank_timeout_s)
    try:
        if not ctx.leader:
            serve(cfg)
            return None
        try:
            result = leader_run()
        except BaseException:
            # Between calls the others wait on the channel: release them. Inside a call they are in a
            # collective this process left; exiting non-zero makes torchrun stop them.
            if not getattr(ctx, "busy", False):
                ctx.channel.send(Message(dp.STOP))
            raise
        ctx.channel.send(Message(dp.STOP))
        return result
    finally:
        sys.stdout.flush()
        dp.shutdown()
