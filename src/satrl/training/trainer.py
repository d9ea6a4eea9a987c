"""The trainer: one optimizer step over a minibatch (gradient accumulation over its microbatches, the
non-finite guard, the update), and the policy, reference and optimizer it steps.

The trainer does not know who schedules it. It takes padded :class:`~satrl.types.Batch` minibatches whose
``versions`` say which policy produced each token, and reads lag as data: ``lag = self.version - versions``.
``version`` counts optimizer-step slots: a step skipped by the non-finite guard still advances it (the
weights then equal the previous version's), so lag schedules stay a pure function of the step count.

What is not the step it composes (issue 61): the log-probs (:class:`~satrl.training.scorer.Scorer`,
``trainer.scorer``), the batch's advantages (:class:`~satrl.training.batch_advantages.Advantages`,
``trainer.advantages``), the weights on their way out and the shards
(:class:`~satrl.training.placement.WeightExport`, ``trainer.export``) and the step's diagnostics
(:func:`satrl.diagnostics.step.trainer_step_diagnostics`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from satrl.diagnostics.step import trainer_step_diagnostics
from satrl.objectives import ObjectiveSpec, aggregate
from satrl.objectives.components import share_unit
from satrl.objectives.reductions import reduce_metrics
from satrl.objectives.step_size import StepInputs, step_scales, step_size_rules
from satrl.training.batch_advantages import Advantages
from satrl.training.batch_loop import Snapshots, train_batch, version_logp
from satrl.training.microbatches import (
    Micro,
    length_order,
    pick,
    plan_microbatches,
    row_slice,
    split_rows,
    to_device,
)
from satrl.training.placement import OneDevice, Placement, StepPieces, WeightExport
from satrl.training.scorer import Scorer
from satrl.training.settings import TrainerSettings
from satrl.types import Batch

__all__ = ["Trainer"]

# Trainer methods before issue 61 -> (the part that holds them now, its name there): kept as aliases that warn once.
MOVED = {"weights": ("export", "weights"), "weights_held": ("export", "held"), "weight_buckets": ("export", "buckets"),
         "load_weights": ("export", "load"), "write_shards": ("export", "write_shards"),
         "read_shards": ("export", "read_shards"), "engine_model": ("export", "engine_model"),
         "sequence_scores": ("advantages", "sequence_scores"), "token_probs": ("advantages", "token_probs"),
         "logprob_chunk_tokens": ("scorer", "chunk_tokens")}  # fmt: skip
_warned: set[str] = set()


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every decoder layer (transformers' own switch; non-reentrant, so it composes with autocast)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"activation_checkpointing needs a transformers model; got {type(model).__name__}")


def compile_layers(model: torch.nn.Module) -> None:
    """``train.compile``: compile each decoder layer in place (``Module.compile``: one graph per layer, reused by
    all of them, recompiled per new shape up to torch's cache limit; dynamic shapes after the first change)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"train.compile needs a transformers decoder with .layers; got {type(model).__name__}")
    for layer in layers:
        layer.compile()


def scaled_opt_step(opt: torch.optim.Optimizer, scale: float) -> None:
    """One ``opt.step()`` with every param group's lr multiplied by ``scale``, then the base lr put back: the
    optimizer's state dict (and so every checkpoint) only ever holds the base lr."""
    base = [group["lr"] for group in opt.param_groups]
    for group, lr in zip(opt.param_groups, base):
        group["lr"] = lr * scale
    try:
        opt.step()
    finally:
        for group, lr in zip(opt.param_groups, base):
            group["lr"] = lr


class _Targets(NamedTuple):
    """What one step's microbatches are trained toward, on the device, each row-sliced per microbatch."""

    adv: torch.Tensor  # [B]
    lag: torch.Tensor  # [B, T] realized lag of each token
    old_logp: torch.Tensor | None  # [B, T] the recomputed denominator, or None (rollout)


class Trainer:
    """Owns the policy, its frozen reference and the optimizer. One :meth:`step` = one optimizer step.

    ``placement`` says where the weights live (:mod:`satrl.training.placement`): the whole policy on
    ``settings.device`` by default, or FSDP2 shards across ranks (:class:`satrl.training.sharded.Sharded`). The
    trainer reads its options from ``settings`` and keeps as attributes only what it derives from them."""

    def __init__(self, model: torch.nn.Module, objective: ObjectiveSpec, settings: TrainerSettings,
                 placement: Placement | None = None) -> None:  # fmt: skip
        s = self.settings = settings
        self.device = torch.device(s.device)
        self.placement = placement if placement is not None else OneDevice(self.device)
        # Master weights, gradients and AdamW state stay fp32; "bf16" runs the forward (and so the backward's
        # matmuls) under autocast. The reference model only runs forwards: it is kept in the compute dtype.
        uses_ref = "ref_logp" in objective.needs  # a KL term with coefficient 0 needs none: not built
        self.model, self.ref_model = self.placement.place(model, uses_ref, self.device, s.dtype)
        if s.activation_checkpointing:  # per decoder layer: keep each layer's input, recompute the rest
            enable_checkpointing(self.model)
        # The paper's quantile is per microbatch; "batch" scope runs the minibatch as one microbatch.
        self.microbatch_tokens = 1 << 62 if s.whole_batch_quantile else s.microbatch_tokens
        self.scorer = Scorer(self.model, self.placement, s, self.microbatch_tokens)
        if s.compile:  # each decoder layer and the log-prob chunk through torch.compile (inductor)
            compile_layers(self.model)
        self.objective = objective
        # A correction (TIS, IcePop, MIS) weighs by pi_old/mu, so it needs pi_old: the trainer's own log-probs
        # at the start of the batch (the paper's Eq. 51 "recomputed" side), whatever the denominator option.
        self.needs_old_logp = s.recomputed_denominator or "old_logp" in objective.needs
        fused = {"fused": True} if s.compile and self.device.type == "cuda" else {}  # one kernel per step on CUDA
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay,
                                     **fused)  # fmt: skip
        # The step-size seam (satrl.objectives.step_size): the objective's declared rules and the lag scaling set
        # each step's lr to base * scale for that opt.step() only. With neither, the lr is never touched.
        self.step_rules = step_size_rules(objective)
        self.scales_lr = bool(self.step_rules) or s.lr_lag_scaling != "none"
        self.advantages = Advantages(self.scorer, objective, s.advantage, s.adv_std_norm)
        self.version = 0
        self.skipped = 0
        self.export = WeightExport(self.placement, self.model, self.opt, lambda: self.version, s.snapshot_cut)
        from satrl.models.routing import moe_num_layers

        self.is_moe = moe_num_layers(model) > 0

    def __getattr__(self, name: str):
        """An old name of what moved out (:data:`MOVED`), with a warning the first time it is asked for."""
        if name not in MOVED or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        part, new = MOVED[name]
        if name not in _warned:
            _warned.add(name)
            warnings.warn(f"Trainer.{name} moved: use trainer.{part}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(getattr(self, part), new)

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**self.placement.optimizer_state(self.opt), "version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.placement.load_optimizer_state(self.opt, state)
        self.version, self.skipped = state["version"], state["skipped"]
        self.export.drop()

    # -- one rollout batch -------------------------------------------------------------------------
    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        """Log-probs under a snapshot's weights, or the current ones if ``state`` is None
        (:meth:`Scorer.logp_with <satrl.training.scorer.Scorer.logp_with>`)."""
        return self.scorer.logp_with(state, mb)

    def train_batch(
        self, batch: Batch, index: int, snapshots: Snapshots, stop_at: int
    ) -> Iterator[tuple[dict[str, float], torch.Tensor]]:
        """Train rollout batch number ``index`` (:func:`satrl.training.batch_loop.train_batch`)."""
        return train_batch(self, batch, index, snapshots, stop_at)

    def version_logp(self, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:  # [B, T]
        """log pi^(l) for each token's own version l (:func:`satrl.training.batch_loop.version_logp`)."""
        return version_logp(self, mb, snapshots)

    # -- one optimizer step ------------------------------------------------------------------------
    def step(
        self,
        mb: Batch,
        adv: torch.Tensor,  # [B]
        old_logp: torch.Tensor | None = None,  # [B, T] recomputed denominator, or None (rollout)
        version_logp: torch.Tensor | None = None,  # [B, T] log pi^(l), for the decomposition
    ) -> dict[str, float]:
        """Accumulate gradients over microbatches, guard against non-finite values, step once.

        Every count the loop needs (the cut into microbatches, their lengths, token counts) is read from the
        batch before it moves to the device, so that the loop itself never waits for the device (pass the
        CPU batch; tests/training/test_trainer_no_host_sync.py)."""
        if self.settings.microbatch_order == "by_length":  # rows of about the same length share a microbatch (and SAT's q)
            order = length_order(mb)
            mb, adv = split_rows(mb, order), adv[order]
            old_logp, version_logp = pick(old_logp, order), pick(version_logp, order)
        plan = plan_microbatches(mb, self.microbatch_tokens)
        n_tok, n_seq = int(mb.mask.sum()), int(mb.mask.any(1).sum())
        weights = [int(mb.mask[p.start : p.end].sum()) / max(n_tok, 1) for p in plan]  # host-side: the CPU batch's
        dev = self.device
        mb, adv = to_device(mb, dev), adv.to(dev)
        old_logp = None if old_logp is None else old_logp.to(dev)
        version_logp = None if version_logp is None else version_logp.to(dev)
        self.opt.zero_grad(set_to_none=True)
        self.export.drop()  # the last version's CPU copy: whoever needs it holds it by now
        lag = (self.version - mb.versions).clamp(min=0)  # [B, T]
        pieces = self._accumulate(plan, mb, _Targets(adv, lag, old_logp), (n_tok, n_seq))
        got = self.placement.gathered(plan, mb.mask.shape[0], pieces)
        self.microbatch_metrics = got.metrics  # the last step's, per microbatch in plan order (0-dim tensors; tests)
        scales = lambda: step_scales(self.step_rules, self.settings.lr_lag_scaling, StepInputs(got.d, mb.mask, lag))  # noqa: E731
        out = self._update(got.losses, reduce_metrics(got.metrics, weights), scales)
        out.update(trainer_step_diagnostics(mb, lag, adv, version_logp, got))
        return out

    def _accumulate(self, plan: list[Micro], mb: Batch, t: _Targets, totals: tuple[int, int]) -> StepPieces:
        """Forward and backward each microbatch this process runs of ``plan`` (gradients accumulate); returns each
        one's loss share (float64, detached; summed after the loop, no sync), objective metrics and per-token
        tensors, in :meth:`Placement.assigned`'s order."""
        n_tok, n_seq = totals
        seq_mode = share_unit(self.settings.aggregation) == "sequence"
        pieces = StepPieces()
        for p, counts in self.placement.assigned(plan):
            sl = slice(p[0], p[1])
            m = row_slice(mb, p[0], p[1])
            logp, used = self.scorer.logp(self.model, m, p, capture=self.is_moe and m.routing is not None)
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = self.scorer.logp(self.ref_model, m, p)[0]
            if used is not None:
                pieces.routing.append(used)
            out = self.objective(
                logp=logp,
                behavior_logp=m.behavior_logp,
                adv=t.adv[sl],
                mask=m.mask,
                ref_logp=ref_logp,
                lag=t.lag[sl],
                old_logp=None if t.old_logp is None else t.old_logp[sl],
            )
            share = (m.mask.any(1).sum() / max(n_seq, 1)) if seq_mode else (m.mask.sum() / max(n_tok, 1))
            loss = aggregate(out.loss, m.mask, self.settings.aggregation) * share
            if not counts:  # a placement's zero-weight copy (it runs so that every rank runs as many): adds nothing
                loss = loss * 0.0
            loss.backward()
            pieces.losses.append(loss.detach().to(torch.float64))
            pieces.metrics.append(out.metrics)
            pieces.gate.append(out.tokens.gate)
            pieces.clipped.append(out.tokens.clipped)
            pieces.d.append(out.tokens.d)
            pieces.logp.append(logp.detach())
        return pieces

    def _update(self, losses: list[torch.Tensor], reduced: dict[str, torch.Tensor],
                step_scales: Callable[[], dict[str, torch.Tensor]]) -> dict[str, float]:  # fmt: skip
        """The non-finite guard and the optimizer step, after one device sync for the guard, the loss and every
        metric (``reduced``: combined as each declares, satrl.objectives.reductions, still tensors)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for loss in losses:  # in microbatch order, as one device sums them
            total = total + loss
        keys = list(reduced)
        checks = [torch.isfinite(total), self.placement.grads_finite(self.model)]
        # The step-size seam: from the whole minibatch's tokens (gathered: the same numbers on every rank).
        scaling = step_scales() if self.scales_lr else {}
        if scaling:  # a non-finite scale skips the step like a non-finite gradient
            checks.append(torch.isfinite(scaling["train/lr_scale"]))
        flags = torch.stack(checks).all()
        host = torch.stack([flags.to(torch.float64), total, *(reduced[k] for k in keys), *scaling.values()]).tolist()
        finite, total = bool(host[0]), host[1]
        scalars = dict(zip(keys, host[2:]))
        scaled = dict(zip(scaling, host[2 + len(keys) :]))
        if finite:
            if self.settings.grad_clip is not None:
                scalars["grad_norm"] = self.placement.clip_grads(self.model, self.settings.grad_clip)
            if scaled:
                scaled_opt_step(self.opt, scaled["train/lr_scale"])
            else:
                self.opt.step()
        else:  # never poison the model: weights and optimizer state stay untouched
            self.skipped += 1
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return {"loss": total, "skipped": float(not finite), **{f"obj/{k}": v for k, v in scalars.items()}, **scaled}
