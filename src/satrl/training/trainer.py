"""The trainer: log-probs, one optimizer step over a minibatch, the non-finite guard, diagnostics.

The trainer does not know who schedules it. It takes padded :class:`~satrl.types.Batch` minibatches whose
``versions`` say which policy produced each token, and reads lag as data: ``lag = self.version - versions``.
``version`` counts optimizer-step slots: a step skipped by the non-finite guard still advances it (the
weights then equal the previous version's), so lag schedules stay a pure function of the step count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from torch.func import functional_call

from satrl import diagnostics as diag
from satrl.dtypes import CONFIG_DTYPES
from satrl.objectives import ObjectiveSpec, aggregate
from satrl.objectives.components import share_unit
from satrl.objectives.reductions import reduce_metrics
from satrl.objectives.step_size import (
    StepInputs,
    advantage_rule,
    lag_step_scale,
    step_size_rules,
)
from satrl.tensors import scoring_positions
from satrl.training.advantages import AdvantageInputs
from satrl.training.baselines import ADVANTAGES, DEFAULT_ADVANTAGE, resolve_advantage
from satrl.training.batch_loop import Snapshots, train_batch, version_logp
from satrl.training.logprobs import (
    chunk_for_vocab,
    full_logits_bytes,
    resolve_chunk_tokens,
    response_logp,
    response_probs,
    vocab_size,
)
from satrl.training.microbatches import (
    Micro,
    length_order,
    pick,
    plan_microbatches,
    row_slice,
    split_rows,
    to_device,
)
from satrl.training.placement import OneDevice, Placement, StepOutputs, StepPieces
from satrl.training.score_norms import ChunkedHead, score_norms
from satrl.training.settings import TrainerSettings
from satrl.types import Batch
from satrl.weights.buckets import Bucket, aliases, copy_buckets

__all__ = ["Trainer"]


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


class _Scored(torch.nn.Module):
    """Holds the policy as a submodule so that ``functional_call`` can run any function of it (the chunked
    log-prob path calls the decoder and the LM head separately) with a snapshot's tensors swapped in."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[[torch.nn.Module], torch.Tensor]) -> torch.Tensor:
        return fn(self.policy)


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
        self.compute_dtype = CONFIG_DTYPES[s.dtype]
        uses_ref = "ref_logp" in objective.needs  # a KL term with coefficient 0 needs none: not built
        self.model, self.ref_model = self.placement.place(model, uses_ref, self.device, s.dtype)
        if s.activation_checkpointing:  # per decoder layer: keep each layer's input, recompute the rest
            enable_checkpointing(self.model)
        self.logprob_chunk_tokens = resolve_chunk_tokens(s.logprob_chunk_tokens, self.model)
        if s.compile:  # each decoder layer and the log-prob chunk through torch.compile (inductor)
            compile_layers(self.model)
        self.objective = objective
        # A correction (TIS, IcePop, MIS) weighs by pi_old/mu, so it needs pi_old: the trainer's own log-probs
        # at the start of the batch (the paper's Eq. 51 "recomputed" side), whatever the denominator option.
        self.needs_old_logp = s.recomputed_denominator or "old_logp" in objective.needs
        fused = {"fused": True} if s.compile and self.device.type == "cuda" else {}  # one kernel per step on CUDA
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay,
                                     **fused)  # fmt: skip
        # The paper's quantile is per microbatch; "batch" scope runs the minibatch as one microbatch.
        self.microbatch_tokens = 1 << 62 if s.whole_batch_quantile else s.microbatch_tokens
        # The step-size seam (satrl.objectives.step_size): the objective's declared rules and the lag scaling set
        # each step's lr to base * scale for that opt.step() only. With neither, the lr is never touched.
        self.step_rules = step_size_rules(objective)
        self.scales_lr = bool(self.step_rules) or s.lr_lag_scaling != "none"
        self.baseline = advantage_rule(objective)  # None: train.advantage's (GRPO's group mean by default)
        self.advantage = resolve_advantage(s.advantage)
        if self.baseline is not None and self.advantage != DEFAULT_ADVANTAGE:
            raise ValueError(f"train.advantage={self.advantage.name}: the objective brings its own baseline (vcpo's "
                             "baseline); choose one (objective.correction.baseline=group_mean, or train.advantage="
                             "group_mean)")  # fmt: skip
        self.version = 0
        self.skipped = 0
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None  # (version, CPU copy): see weights()
        from satrl.models.routing import moe_num_layers

        self.is_moe = moe_num_layers(model) > 0

    def _autocast(self) -> contextlib.AbstractContextManager:
        """The compute-dtype context of every forward (nothing at all in fp32, so fp32 numbers are unchanged)."""
        if self.settings.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _logp(self, model: torch.nn.Module, m: Batch, plan: Micro, capture: bool = False):
        """``response_logp`` of microbatch ``m`` with the host-side facts of its plan entry (no host sync): the
        decoder on its longest row, the LM head on its longest response (a plain ``(start, end, longest,
        padded)`` tuple: on the batch's whole response width)."""
        chunk = self.logprob_chunk_tokens
        self._check_full_logits(plan, chunk)
        with self._autocast():
            return response_logp(model, m, self.settings.temperature, self._routing(m), capture, length=plan.longest,
                                 padded=plan.padded, chunk_tokens=chunk,
                                 width=plan.width, compiled=self.settings.compile)  # fmt: skip

    def _check_full_logits(self, p: Micro, chunk: int) -> None:
        """On CUDA with ``logprob_chunk_tokens=0``: refuse a microbatch whose full-vocabulary logits would not fit
        in the device memory free now (an estimate, :func:`full_logits_bytes`), before any of it runs."""
        if chunk > 0 or self.device.type != "cuda":
            return
        need = full_logits_bytes(p.end - p.start, p.longest, p.width, vocab_size(self.model), self.compute_dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        if need > free:
            raise MemoryError(
                f"logprob_chunk_tokens=0: a microbatch of {p.end - p.start} rows x {p.longest} tokens needs about "
                f"{need / 2**30:.1f} GiB of full-vocabulary logits, {free / 2**30:.1f} GiB is free on {self.device}; "
                f"set train.logprob_chunk_tokens=auto (chunks of {chunk_for_vocab(vocab_size(self.model))} tokens) or "
                "lower train.microbatch_tokens"
            )

    # -- state -------------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """A detached CPU copy of the current weights, safe to hand to an engine or a checkpoint (empty on a
        data-parallel rank other than 0).

        Copied at most once per version: the loop pushes them to the engine and the snapshot store, the
        evaluator and the checkpoint read them at the same version, and all get the same dict (treat it as
        read-only). The copy is dropped at the next optimizer step, or when the weights are loaded."""
        if not self.weights_held():
            self._weights = (self.version, self.placement.weights(self.model))
        return self._weights[1]

    def weights_held(self) -> bool:
        """Whether :meth:`weights` would return the copy it holds (no gathering, no copy)."""
        return self._weights is not None and self._weights[0] == self.version

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """The current weights as a stream of flat buckets in ``dtype`` (None: as held), tied weights once
        (``satrl.weights.buckets``): at most one bucket on the host at a time, never a full fp32 copy. The
        ``dist`` transport's source; consume it to the end before the next step. Where this version's copy is
        held already (:meth:`weights`) they are cut from it, the same bits without a second copy off the model
        (under data parallel, the copy every rank gathered at a sync point)."""
        if self.weights_held():
            return copy_buckets(self._weights[1], aliases(self.model), dtype, bucket_bytes)
        return self.placement.buckets(self.model, dtype, bucket_bytes)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights (resume from a checkpoint)."""
        self.placement.load(self.model, weights)
        self._weights = None

    def state_dict(self) -> dict:
        return {**self.placement.optimizer_state(self.opt), "version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.placement.load_optimizer_state(self.opt, state)
        self.version, self.skipped = state["version"], state["skipped"]
        self._weights = None

    def write_shards(self, path: Path | None) -> None:
        """Write the state the placement keeps in shards into checkpoint folder ``path`` (none on one device;
        under data parallel every rank writes its own, into the folder rank 0 names: the others pass None)."""
        self.placement.write(path, self.model, self.opt)

    def read_shards(self, path: Path | None) -> None:
        """Read what :meth:`write_shards` wrote (``path`` as there)."""
        self.placement.read(path, self.model, self.opt)
        self._weights = None

    def engine_model(self) -> torch.nn.Module:
        """The policy as one module, for an engine to copy (its weights then come from :meth:`weights`)."""
        return self.placement.engine_model(self.model)

    # -- log-probs ---------------------------------------------------------------------------------
    def _routing(self, mb: Batch) -> torch.Tensor | None:
        if self.settings.r3 and mb.routing is None:  # replaying nothing would silently turn R3 off
            raise ValueError(
                "r3=true but these samples carry no MoE routing: the engine did not capture it "
                "(use engine=torch, or an engine build that returns routed experts), or set r3=false"
            )
        return mb.routing if self.settings.r3 else None

    @torch.no_grad()
    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        """Log-probs under other weights (a snapshot), or under the current ones if ``state`` is None.

        On one device a snapshot runs through the policy's own modules with its tensors swapped in
        (``functional_call``): no second model is kept, and its weights come to the device for this call only
        (:meth:`Placement.swapped`); at lag 0 this equals the current forward bit for bit."""
        if self.settings.microbatch_order == "by_length":  # the same rows, cut as the step cuts them; back in batch order
            order = length_order(mb)
            return self._logp_with(state, split_rows(mb, order))[torch.argsort(order)]
        return self._logp_with(state, mb)

    def _logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        plan = plan_microbatches(mb, self.microbatch_tokens)
        dev_mb = to_device(mb, self.device)
        if state is None:
            return self._current_logp(plan, dev_mb)
        with self.placement.swapped(self.model, state) as tensors:
            if tensors is None:  # the snapshot is in the parameters for now
                return self._current_logp(plan, dev_mb)
            swapped = {f"policy.{k}": v for k, v in tensors.items()}
            scored = _Scored(self.model)
            pieces = []
            for p in plan:
                m = row_slice(dev_mb, p[0], p[1])
                pieces.append(functional_call(scored, swapped, (lambda model, m=m, p=p: self._logp(model, m, p)[0],),
                                              tie_weights=False, strict=False))  # fmt: skip
            return torch.cat(pieces).cpu()

    def _current_logp(self, plan: list[Micro], dev_mb: Batch) -> torch.Tensor:  # [B, T]
        pieces = [self._logp(self.model, row_slice(dev_mb, p[0], p[1]), p)[0] for p in plan]
        return torch.cat(pieces).cpu()

    # -- one rollout batch -------------------------------------------------------------------------
    def train_batch(
        self, batch: Batch, index: int, snapshots: Snapshots, stop_at: int
    ) -> Iterator[tuple[dict[str, float], torch.Tensor]]:
        """Train rollout batch number ``index`` (:func:`satrl.training.batch_loop.train_batch`)."""
        return train_batch(self, batch, index, snapshots, stop_at)

    def version_logp(self, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:  # [B, T]
        """log pi^(l) for each token's own version l (:func:`satrl.training.batch_loop.version_logp`)."""
        return version_logp(self, mb, snapshots)

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages [B] (or [B, T], a per-token baseline) with their metrics: ``train.advantage``'s baseline
        (:mod:`satrl.training.baselines`; GRPO's group mean by default), or the objective's own (VCPO's OPOB),
        each from what it needs: the sequences' weights and score norms, or the tokens' probabilities."""
        if self.baseline is not None:
            log_w, score_sq = self.sequence_scores(batch)
            adv, stats = self.baseline(batch.rewards, batch.group_index, log_w, score_sq, self.settings.adv_std_norm)
        else:
            chosen = ADVANTAGES.get(self.advantage.name)
            log_w, score_sq = self.sequence_scores(batch) if "score_norms" in chosen.needs else (None, None)
            old_logp, sum_pi_sq = self.token_probs(batch) if "token_probs" in chosen.needs else (None, None)
            inp = AdvantageInputs(batch.rewards, batch.group_index, batch.mask, batch.behavior_logp, log_w, score_sq,
                                  old_logp, sum_pi_sq)  # fmt: skip
            adv, stats = chosen.fn(inp, std_norm=self.settings.adv_std_norm, **self.advantage.kwargs())
        return adv, {f"obj/{k}": float(v) for k, v in stats.items()}

    @torch.no_grad()
    def token_probs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:  # [B, T], [B, T] float32, CPU
        """Per token, at the current weights: log pi(y_t) and sum_v pi(v)^2, the optimal token baseline's inputs
        (:func:`~satrl.training.logprobs.response_probs`: one forward per microbatch of the step's plan, no
        backward); rows summed across data-parallel ranks as in :meth:`sequence_scores`."""
        logp, sq = torch.zeros(batch.mask.shape), torch.zeros(batch.mask.shape)
        for p, real in self.placement.assigned(plan_microbatches(batch, self.microbatch_tokens)):
            m = to_device(row_slice(batch, p.start, p.end), self.device)
            with self._autocast():
                got = response_probs(self.model, m, self.settings.temperature, self._routing(m), length=p.longest,
                                     padded=p.padded, chunk_tokens=self.logprob_chunk_tokens, width=p.width)  # fmt: skip
            if real:  # else a zero-weight copy that lines up the ranks' collectives (data parallel)
                logp[p.start : p.end], sq[p.start : p.end] = got[0].cpu(), got[1].cpu()
        return self.placement.summed(logp), self.placement.summed(sq)

    def sequence_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:  # [B], [B] float64, CPU
        """Per row i, at the current weights: log w_i = sum_t (log pi - log mu) and ||grad_theta sum_t log pi||^2,
        the inputs of an objective's advantage rule (VCPO's OPOB). One forward and one backward per microbatch
        of the step's plan (:func:`satrl.training.score_norms.score_norms`); the backward stops at the layers'
        outputs, so the parameters' ``.grad`` are not touched. Under data parallel each rank takes the microbatches
        the placement assigns it (as a step does) and the rows' values are summed across ranks (each row is nonzero
        on one rank only: the sum is exact). With chunked log-probs (``logprob_chunk_tokens``
        > 0) the LM head's share is rebuilt row by row (:class:`~satrl.training.score_norms.ChunkedHead`), so the
        pass holds no more vocabulary-sized tensors than the step does."""
        rows = batch.mask.shape[0]
        log_w, score_sq = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dtype=torch.float64)
        for p, real in self.placement.assigned(plan_microbatches(batch, self.microbatch_tokens)):
            m = to_device(row_slice(batch, p.start, p.end), self.device)
            head = None
            if self.logprob_chunk_tokens > 0:
                head = ChunkedHead(self.model.get_output_embeddings(), m.response_ids, self.settings.temperature)
            logp, sq = score_norms(self.model, lambda m=m, p=p: self._logp(self.model, m, p)[0], m.mask, head)
            if real:  # else a zero-weight copy that lines up the ranks' collectives (data parallel)
                w = torch.where(m.mask, logp.to(torch.float64) - m.behavior_logp.to(torch.float64), 0.0).sum(1)
                log_w[p.start : p.end], score_sq[p.start : p.end] = w.cpu(), sq.cpu()
        return self.placement.summed(log_w), self.placement.summed(score_sq)

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
        self._weights = None  # the last version's CPU copy: whoever needs it holds it by now
        lag = (self.version - mb.versions).clamp(min=0)  # [B, T]
        pieces = self._accumulate(plan, mb, _Targets(adv, lag, old_logp), (n_tok, n_seq))
        got = self.placement.gathered(plan, mb.mask.shape[0], pieces)
        self.microbatch_metrics = got.metrics  # the last step's, per microbatch in plan order (0-dim tensors; tests)
        out = self._update(got.losses, reduce_metrics(got.metrics, weights), lambda: self._step_scales(mb.mask, lag, got))
        out.update(self._diagnostics(mb, lag, got, version_logp, adv))
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
            logp, used = self._logp(self.model, m, p, capture=self.is_moe and m.routing is not None)
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = self._logp(self.ref_model, m, p)[0]
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
                self._scaled_opt_step(scaled["train/lr_scale"])
            else:
                self.opt.step()
        else:  # never poison the model: weights and optimizer state stay untouched
            self.skipped += 1
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return {"loss": total, "skipped": float(not finite), **{f"obj/{k}": v for k, v in scalars.items()}, **scaled}

    # -- the step-size seam ------------------------------------------------------------------------
    def _step_scales(self, mask: torch.Tensor, lag: torch.Tensor, got: StepOutputs) -> dict[str, torch.Tensor]:
        """This step's lr multiplier ``train/lr_scale`` (0-dim float64, on the device) and its factors: the
        objective's rules (``obj/step_scale`` and their metrics) times the lag scaling (``train/lag_lr_scale`` at
        realized lag ``train/lr_lag``). Pure functions of the minibatch's detached tokens."""
        out: dict[str, torch.Tensor] = {}
        scale = torch.ones((), dtype=torch.float64, device=self.device)
        if self.step_rules:
            inp = StepInputs(d=got.d, mask=mask, lag=lag)
            obj = torch.ones((), dtype=torch.float64, device=self.device)
            for rule in self.step_rules:
                s, metrics = rule(inp)
                obj = obj * s
                out.update({f"obj/{k}": v.to(torch.float64) for k, v in metrics.items()})
            out["obj/step_scale"] = obj
            scale = scale * obj
        if self.settings.lr_lag_scaling != "none":
            s, S = lag_step_scale(lag, mask, self.settings.lr_lag_scaling)
            out["train/lag_lr_scale"], out["train/lr_lag"] = s, S
            scale = scale * s
        out["train/lr_scale"] = scale
        return out

    def _scaled_opt_step(self, scale: float) -> None:
        """One ``opt.step()`` with every param group's lr multiplied by ``scale``, then the base lr put back: the
        optimizer's state dict (and so every checkpoint) only ever holds the base lr."""
        base = [group["lr"] for group in self.opt.param_groups]
        for group, lr in zip(self.opt.param_groups, base):
            group["lr"] = lr * scale
        try:
            self.opt.step()
        finally:
            for group, lr in zip(self.opt.param_groups, base):
                group["lr"] = lr

    def _diagnostics(self, mb: Batch, lag: torch.Tensor, got: StepOutputs, version_logp: torch.Tensor | None,
                     adv: torch.Tensor) -> dict:  # fmt: skip
        engine_routing = None
        if got.routing is not None:  # the engine's experts at the scoring positions, vs the ones this forward used
            pos = scoring_positions(mb.prompt_len, mb.mask.shape[1], mb.routing.shape[1])  # [B, T]
            engine_routing = mb.routing.gather(1, pos[:, :, None, None].expand(-1, -1, *mb.routing.shape[2:]))
        out = diag.step_diagnostics(
            logp=got.logp,
            behavior_logp=mb.behavior_logp,
            mask=mb.mask,
            lag=lag,
            tok={"tok/gate": got.gate, "tok/clipped": got.clipped, "tok/d": got.d},
            logp_at_version=version_logp,
            engine_routing=engine_routing,
            trainer_routing=got.routing,
            adv=adv,
        )
        return {k: float(v) for k, v in out.items()}
