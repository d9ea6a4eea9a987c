"""Which rank does what in a data-parallel run (``torchrun --nproc_per_node=N -m satrl train ...``).

Rank 0 runs the training loop as on one device, with a data-parallel trainer; every other rank serves that
trainer's calls (:mod:`satrl.training.dp_calls`, docs/design.md "Data parallel"). Settings data parallel does not
support are refused here, on every rank, before any process group exists: one line naming the setting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from satrl.config import ConfigError, RunConfig
from satrl.dtypes import set_tf32
from satrl.pipeline.launch.setup import build_trainer
from satrl.training import dp
from satrl.training import dp_calls as calls


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


def serve(cfg: RunConfig) -> None:
    """Ranks > 0: wait for rank 0 to start the trainer, build the same one, then join each call it announces
    until it stops (or the job ends: torchrun stops every rank when one fails)."""
    ctx = dp.current()
    torch.set_num_threads(cfg.trainer_threads)
    set_tf32(cfg.train.tf32)
    torch.manual_seed(cfg.seed)
    if not isinstance(calls.decode(ctx.channel.recv()), calls.Start):
        return  # Stop: rank 0 refused the run before training began
    trainer, _ = build_trainer(cfg)
    trainer.serve()


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
                calls.announce(ctx.channel, calls.Stop())
            raise
        calls.announce(ctx.channel, calls.Stop())
        return result
    finally:
        sys.stdout.flush()
        dp.shutdown()
