"""The trainer: log-probs, one optimizer step over a minibatch, the non-finite guard, diagnostics.

The trainer does not know who schedules it. It takes padded :class:`~satrl.types.Batch` minibatches whose
``versions`` say which policy produced each token, and reads lag as data: ``lag = self.version - versions``.
``version`` counts optimizer-step slots: a step skipped by the non-finite guard still advances it (the
weights then equal the previous version's), so lag schedules stay a pure function of the step count.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch.func import functional_call

from satrl import diagnostics as diag
from satrl.dtypes import CONFIG_DTYPES
from satrl.objectives import ObjectiveSpec, aggregate
from satrl.objectives.aggregation import share_unit
from satrl.objectives.reductions import reduce_metrics
from satrl.objectives.step_size import (
    StepInputs,
    advantage_rule,
    lag_step_scale,
    step_size_rules,
)
from satrl.tensors import scoring_positions
from satrl.training.advantages import group_advantages
from satrl.training.logprobs import (
    chunk_for_vocab,
    full_logits_bytes,
    resolve_chunk_tokens,
    response_logp,
    vocab_size,
)
from satrl.training.settings import TrainerSettings
from satrl.types import Batch
from satrl.weights.buckets import Bucket, buckets

__all__ = ["Micro", "Trainer", "cpu_copy", "length_order", "microbatches", "plan_microbatches", "response_logp",
           "split_rows", "to_device"]  # fmt: skip

Snapshots = Callable[[int], "dict[str, torch.Tensor] | None"]


def cpu_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model``'s state dict (the one place the trainer copies weights off the model)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def split_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The sub-batch of the given row indices (T kept, so per-token tensors line up across pieces)."""
    pick = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    pick["sample_ids"] = [batch.sample_ids[i] for i in rows.tolist()] if batch.sample_ids else []
    return Batch(**pick)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch with every tensor on ``device`` (a no-op on the same device)."""
    moved = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    return Batch(**moved)


def row_slice(batch: Batch, start: int, end: int) -> Batch:
    """Rows ``start:end`` of a batch as views (no copy, no index tensor, no device work)."""
    pick = {k: (v[start:end] if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    pick["sample_ids"] = batch.sample_ids[start:end]
    return Batch(**pick)


class Micro(NamedTuple):
    """One microbatch of a plan: rows ``start:end``, the longest row (prompt + response) ``longest``, whether a
    row is shorter (``padded``), and ``width``, the longest response (the LM head's positions per row)."""

    start: int
    end: int
    longest: int
    padded: bool
    width: int


def plan_microbatches(mb: Batch, token_budget: int) -> list[Micro]:
    """Cut consecutive rows into microbatches whose padded length fits the budget (at least one row each):
    ``(start, end, longest, padded, width)`` per microbatch (:class:`Micro`). Read on the host: pass the CPU
    batch, so that the device never waits for it."""
    lengths = mb.attention_mask.sum(1).tolist()
    responses = (mb.attention_mask.sum(1) - mb.prompt_len).tolist()
    plan, start = [], 0
    while start < len(lengths):
        end, longest = start, 0
        while end < len(lengths):
            longest_next = max(longest, lengths[end])
            if end > start and longest_next * (end - start + 1) > token_budget:
                break
            longest, end = longest_next, end + 1
        width = max(1, min(mb.mask.shape[1], max(responses[start:end])))
        plan.append(Micro(start, end, longest, min(lengths[start:end]) < longest, width))
        start = end
    return plan


def length_order(mb: Batch) -> torch.Tensor:
    """``microbatch_order=by_length``: the rows longest first, so that the consecutive rows one microbatch takes
    are of about the same length; ties in batch order. The key is prompt + 2 x response: the response counts in
    the decoder's positions (prompt + response) and again in the LM head's (response), so that neither the
    decoder's nor the head's padding dominates (benchmarks/token_efficiency.py: 1.06x and 1.07x on the RL mix,
    against 1.02x and 1.13x for prompt + response alone). Read on the host (the CPU batch)."""
    lengths = mb.attention_mask.sum(1).to(torch.int64)
    key = 2 * lengths - mb.prompt_len.to(torch.int64)
    return torch.sort(key, descending=True, stable=True).indices


def microbatches(mb: Batch, token_budget: int) -> Iterator[Batch]:
    """The microbatches of :func:`plan_microbatches`, as batches."""
    for p in plan_microbatches(mb, token_budget):
        yield row_slice(mb, p.start, p.end)


def epoch_order(seed: int, index: int, epoch: int, n: int) -> torch.Tensor:
    """The row order of one pass over a batch: a permutation of ``n`` rows, distinct and reproducible for each
    (run seed, batch index, epoch). The mixing constants are arbitrary primes, kept so runs reproduce."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + index * 31 + epoch))


def _pick(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if x is None else x[rows]


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
    """Owns the policy, its frozen reference and the optimizer. One :meth:`step` = one optimizer step."""

    def __init__(self, model: torch.nn.Module, objective: ObjectiveSpec, settings: TrainerSettings) -> None:
        s = self.settings = settings
        self.device = torch.device(s.device)
        self.microbatch_order = s.microbatch_order
        # Master weights, gradients and AdamW state stay fp32; "bf16" runs the forward (and so the backward's
        # matmuls) under autocast. The reference model only runs forwards: it is kept in the compute dtype.
        self.dtype, self.compute_dtype = s.dtype, CONFIG_DTYPES[s.dtype]
        if self.device.type == "cuda":  # fp32 matmuls on TF32 tensor cores (10-bit mantissa inputs), or not
            torch.backends.cuda.matmul.allow_tf32 = s.tf32  # a process-wide switch: the last trainer built sets it
            torch.backends.cudnn.allow_tf32 = s.tf32
        uses_ref = "ref_logp" in objective.needs  # a KL term with coefficient 0 needs none: not built
        self.model, self.ref_model = self._place(model, uses_ref)
        if s.activation_checkpointing:  # per decoder layer: keep each layer's input, recompute the rest
            enable_checkpointing(self.model)
        self.logprob_chunk_tokens = resolve_chunk_tokens(s.logprob_chunk_tokens, self.model)
        self.compiled = s.compile
        if s.compile:  # each decoder layer and the log-prob chunk through torch.compile (inductor)
            compile_layers(self.model)
        self.objective, self.aggregation = objective, s.aggregation
        # A correction (TIS, IcePop, MIS) weighs by pi_old/mu, so it needs pi_old: the trainer's own log-probs
        # at the start of the batch (the paper's Eq. 51 "recomputed" side), whatever the denominator option.
        self.needs_old_logp = s.recomputed_denominator or "old_logp" in objective.needs
        fused = {"fused": True} if s.compile and self.device.type == "cuda" else {}  # one kernel per step on CUDA
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay,
                                     **fused)  # fmt: skip
        self.grad_clip = s.grad_clip
        self.temperature = s.temperature
        # The paper's quantile is per microbatch; "batch" scope runs the minibatch as one microbatch.
        self.microbatch_tokens = 1 << 62 if s.whole_batch_quantile else s.microbatch_tokens
        self.r3 = s.r3
        # How one rollout batch is trained (train_batch): ppo_epochs passes of `minibatches` optimizer steps.
        self.minibatches, self.ppo_epochs, self.adv_std_norm = s.minibatches, s.ppo_epochs, s.adv_std_norm
        self.decompose, self.seed = s.decompose, s.seed
        # The step-size seam (satrl.objectives.step_size): the objective's declared rules and the lag scaling set
        # each step's lr to base * scale for that opt.step() only. With neither, the lr is never touched.
        self.step_rules, self.lr_lag_scaling = step_size_rules(objective), s.lr_lag_scaling
        self.scales_lr = bool(self.step_rules) or s.lr_lag_scaling != "none"
        self.baseline = advantage_rule(objective)  # None: GRPO's group advantages
        self.version = 0
        self.skipped = 0
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None  # (version, CPU copy): see weights()
        from satrl.models.routing import moe_num_layers

        self.is_moe = moe_num_layers(model) > 0

    def _place(self, model: torch.nn.Module, uses_ref: bool) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """The policy on the device with fp32 master weights, and the frozen reference in the compute dtype if
        a KL term needs one (copied before the policy moves, so the device never holds an fp32 copy of it)."""
        ref = None
        if uses_ref:
            ref = copy.deepcopy(model).to(self.device, self.compute_dtype).eval().requires_grad_(False)
        return model.float().to(self.device).train(), ref

    def _autocast(self) -> contextlib.AbstractContextManager:
        """The compute-dtype context of every forward (nothing at all in fp32, so fp32 numbers are unchanged)."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _logp(self, model: torch.nn.Module, m: Batch, plan: Micro, capture: bool = False):
        """``response_logp`` of microbatch ``m`` with the host-side facts of its plan entry (no host sync): the
        decoder on its longest row, the LM head on its longest response (a plain ``(start, end, longest,
        padded)`` tuple: on the batch's whole response width)."""
        if not isinstance(plan, Micro):
            plan = Micro(*plan, m.mask.shape[1])
        self._check_full_logits(plan)
        with self._autocast():
            return response_logp(model, m, self.temperature, self._routing(m), capture, length=plan.longest,
                                 padded=plan.padded, chunk_tokens=self.logprob_chunk_tokens,
                                 width=plan.width, compiled=self.compiled)  # fmt: skip

    def _check_full_logits(self, p: Micro) -> None:
        """On CUDA with ``logprob_chunk_tokens=0``: refuse a microbatch whose full-vocabulary logits would not fit
        in the device memory free now (an estimate, :func:`full_logits_bytes`), before any of it runs."""
        if self.logprob_chunk_tokens > 0 or self.device.type != "cuda":
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
        """A detached CPU copy of the current weights, safe to hand to an engine or a checkpoint.

        Copied at most once per version: the loop pushes them to the engine and the snapshot store, the
        evaluator and the checkpoint read them at the same version, and all get the same dict (treat it as
        read-only). The copy is dropped at the next optimizer step, or when the weights are loaded."""
        if self._weights is None or self._weights[0] != self.version:
            self._weights = (self.version, cpu_copy(self.model))
        return self._weights[1]

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """The current weights as a stream of flat buckets in ``dtype`` (None: as held), tied weights once
        (``satrl.weights.buckets``): at most one bucket on the host at a time, never a full fp32 copy. The
        ``dist`` transport's source; consume it to the end before the next step."""
        return buckets(self.model, dtype, bucket_bytes)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights (resume from a checkpoint)."""
        self.model.load_state_dict(weights)
        self._weights = None

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        if "opt" not in state:  # its optimizer state is in DCP shards (satrl.training.dp_trainer)
            raise ValueError("written by a data-parallel run: resume it under torchrun")
        self.opt.load_state_dict(state["opt"])
        self.version, self.skipped = state["version"], state["skipped"]
        self._weights = None

    # -- log-probs ---------------------------------------------------------------------------------
    def _routing(self, mb: Batch) -> torch.Tensor | None:
        if self.r3 and mb.routing is None:  # replaying nothing would silently turn R3 off
            raise ValueError(
                "r3=true but these samples carry no MoE routing: the engine did not capture it "
                "(use engine=torch, or an engine build that returns routed experts), or set r3=false"
            )
        return mb.routing if self.r3 else None

    @torch.no_grad()
    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        """Log-probs under other weights (a snapshot), or under the current ones if ``state`` is None.

        A snapshot runs through the policy's own modules with its tensors swapped in (``functional_call``): no
        second model is kept. Its weights come to the device for this call only, in the dtype of the tensors they
        replace (fp32 master weights): under bf16 autocast a bf16 copy would run the norms and the embedding in
        bf16 and show a policy lag where there is none, so at lag 0 this equals the current forward bit for bit."""
        if self.microbatch_order == "by_length":  # the same rows, cut as the step cuts them; back in batch order
            order = length_order(mb)
            return self._logp_with(state, split_rows(mb, order))[torch.argsort(order)]
        return self._logp_with(state, mb)

    def _logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        plan = plan_microbatches(mb, self.microbatch_tokens)
        dev_mb = to_device(mb, self.device)
        if state is None:
            pieces = [self._logp(self.model, row_slice(dev_mb, p[0], p[1]), p)[0] for p in plan]
            return torch.cat(pieces).cpu()
        own = self.model.state_dict()
        if state.keys() != own.keys():
            raise ValueError("snapshot weights do not match the policy's state dict keys")
        swapped = {f"policy.{k}": v.to(self.device, own[k].dtype) for k, v in state.items()}
        scored = _Scored(self.model)
        pieces = []
        for p in plan:
            m = row_slice(dev_mb, p[0], p[1])
            pieces.append(functional_call(scored, swapped, (lambda model, m=m, p=p: self._logp(model, m, p)[0],),
                                          tie_weights=False, strict=False))  # fmt: skip
        return torch.cat(pieces).cpu()

    @torch.no_grad()
    def version_logp(self, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:  # [B, T]
        """log pi^(l) for each token's own version l (for the d = Delta_pi + Delta_impl split): one forward per
        version present, each token picking its own. A row sampled by one version takes that forward whole, as
        before in-flight updates; padding counts as the row's newest version."""
        out = torch.zeros(mb.mask.shape)
        row_version = torch.where(mb.mask, mb.versions, mb.versions.min()).max(1).values
        token_version = torch.where(mb.mask, mb.versions, row_version[:, None])  # [B, T]
        for v in token_version.unique().tolist():
            state = snapshots(int(v))
            if state is None:
                return None
            rows = (token_version == v).any(1).nonzero().squeeze(1)
            lp = self.logp_with(state, split_rows(mb, rows))
            out[rows] = torch.where(token_version[rows] == v, lp, out[rows])
        return out

    # -- one rollout batch -------------------------------------------------------------------------
    def train_batch(
        self, batch: Batch, index: int, snapshots: Snapshots, stop_at: int
    ) -> Iterator[tuple[dict[str, float], torch.Tensor]]:
        """Train rollout batch number ``index``: everything the trainer does with it, in order.

        1. GRPO advantages from the batch's rewards and groups;
        2. pi_old, the trainer's own log-probs before the batch, when a correction or the recomputed
           denominator needs it;
        3. for the d = Delta_pi + Delta_impl split (``decompose``), the log-probs under each sample's own
           weight version (``snapshots``: version -> weights);
        4. ``ppo_epochs`` passes, each a seeded permutation of the rows cut into ``minibatches`` optimizer steps.

        Yields ``(metrics, rows)`` after every optimizer step, so that the loop can push weights, log and
        evaluate between steps; stops as soon as the version reaches ``stop_at`` (the run's last step).
        """
        batch_metrics: dict[str, float] = {}
        if self.baseline is None:
            adv = group_advantages(batch.rewards, batch.group_index, self.adv_std_norm)
        else:  # the objective's own baseline (VCPO's OPOB), from each sequence's weight and score norm
            log_w, score_sq = self.sequence_scores(batch)
            adv, stats = self.baseline(batch.rewards, batch.group_index, log_w, score_sq, self.adv_std_norm)
            batch_metrics = {f"obj/{k}": float(v) for k, v in stats.items()}
        old_logp = self.logp_with(None, batch) if self.needs_old_logp else None
        vlogp = self.version_logp(batch, snapshots) if self.decompose else None
        for epoch in range(self.ppo_epochs):
            if self.version >= stop_at:
                return
            for rows in torch.tensor_split(epoch_order(self.seed, index, epoch, batch.mask.shape[0]), self.minibatches):
                metrics = self.step(split_rows(batch, rows), adv[rows], _pick(old_logp, rows), _pick(vlogp, rows))
                metrics.update(batch_metrics)
                yield metrics, rows
                if self.version >= stop_at:
                    return

    def sequence_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:  # [B], [B] float64, CPU
        """Per row i, at the current weights: log w_i = sum_t (log pi - log mu) and ||grad_theta sum_t log pi||^2,
        the inputs of an objective's advantage rule (VCPO's OPOB). One forward and one backward per row, through
        ``torch.autograd.grad``: the parameters' ``.grad`` are not touched."""
        dev_mb = to_device(batch, self.device)
        lengths = batch.attention_mask.sum(1).tolist()
        params = [p for p in self.model.parameters() if p.requires_grad]
        log_w, score_sq = [], []
        for i, length in enumerate(lengths):
            m = row_slice(dev_mb, i, i + 1)
            logp, _ = self._logp(self.model, m, Micro(i, i + 1, length, False, batch.mask.shape[1]))
            grads = torch.autograd.grad(torch.where(m.mask, logp, 0.0).sum(), params, allow_unused=True)
            norms = torch._foreach_norm([g for g in grads if g is not None])  # per tensor, then summed in float64
            score_sq.append(torch.stack(norms).to(torch.float64).square().sum())
            log_w.append(torch.where(m.mask, logp.detach().to(torch.float64) - m.behavior_logp.to(torch.float64), 0.0).sum())
        return torch.stack(log_w).cpu(), torch.stack(score_sq).cpu()

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
        if self.microbatch_order == "by_length":  # rows of about the same length share a microbatch (and SAT's q)
            order = length_order(mb)
            mb, adv = split_rows(mb, order), adv[order]
            old_logp, version_logp = _pick(old_logp, order), _pick(version_logp, order)
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
        losses, per_mb, tok = self._accumulate(plan, mb, _Targets(adv, lag, old_logp), (n_tok, n_seq))
        losses, per_mb, tok = self._gathered(plan, mb.mask.shape[0], losses, per_mb, tok)
        self.microbatch_metrics = per_mb  # the last step's, per microbatch in plan order (0-dim tensors; tests)
        out = self._update(losses, reduce_metrics(per_mb, weights), lambda: self._step_scales(mb.mask, lag, tok))
        out.update(self._diagnostics(mb, lag, tok, version_logp))
        return out

    def _accumulate(self, plan: list[Micro], mb: Batch, t: _Targets, counts: tuple[int, int]) -> tuple:
        """Forward and backward each microbatch of ``plan`` (gradients accumulate); returns each one's loss share
        (float64, detached), its objective metrics, and the per-token tensors, in plan order."""
        n_tok, n_seq = counts
        seq_mode = share_unit(self.aggregation) == "sequence"
        tok = {"logp": [], "gate": [], "clipped": [], "d": [], "routing": []}
        losses: list[torch.Tensor] = []  # each microbatch's share of the loss, summed after the loop (no sync)
        per_mb: list[dict[str, torch.Tensor]] = []
        for p, real in self._assigned(plan, mb):
            sl = slice(p[0], p[1])
            m = row_slice(mb, p[0], p[1])
            logp, used = self._logp(self.model, m, p, capture=self.is_moe and m.routing is not None)
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = self._logp(self.ref_model, m, p)[0]
            if used is not None:
                tok["routing"].append(used)
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
            loss = aggregate(out.loss, m.mask, self.aggregation) * share
            if not real:  # data parallel's padding microbatch: it runs for the collectives and adds nothing
                loss = loss * 0.0
            loss.backward()
            losses.append(loss.detach().to(torch.float64))
            per_mb.append(out.metrics)
            for k in ("gate", "clipped", "d"):
                tok[k].append(getattr(out.tokens, k))
            tok["logp"].append(logp.detach())
        return losses, per_mb, tok

    def _update(self, losses: list[torch.Tensor], reduced: dict[str, torch.Tensor],
                step_scales: Callable[[], dict[str, torch.Tensor]]) -> dict[str, float]:  # fmt: skip
        """The non-finite guard and the optimizer step, after one device sync for the guard, the loss and every
        metric (``reduced``: combined as each declares, satrl.objectives.reductions, still tensors)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for loss in losses:  # in microbatch order, as one device sums them
            total = total + loss
        keys = list(reduced)
        checks = [torch.isfinite(total), self._grads_finite()]
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
            if self.grad_clip is not None:
                scalars["grad_norm"] = self._clip_grads()
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
    def _step_scales(self, mask: torch.Tensor, lag: torch.Tensor, tok: dict) -> dict[str, torch.Tensor]:
        """This step's lr multiplier ``train/lr_scale`` (0-dim float64, on the device) and its factors: the
        objective's rules (``obj/step_scale`` and their metrics) times the lag scaling (``train/lag_lr_scale`` at
        realized lag ``train/lr_lag``). Pure functions of the minibatch's detached tokens."""
        out: dict[str, torch.Tensor] = {}
        scale = torch.ones((), dtype=torch.float64, device=self.device)
        if self.step_rules:
            inp = StepInputs(d=tok["d"], mask=mask, lag=lag)
            obj = torch.ones((), dtype=torch.float64, device=self.device)
            for rule in self.step_rules:
                s, metrics = rule(inp)
                obj = obj * s
                out.update({f"obj/{k}": v.to(torch.float64) for k, v in metrics.items()})
            out["obj/step_scale"] = obj
            scale = scale * obj
        if self.lr_lag_scaling != "none":
            s, S = lag_step_scale(lag, mask, self.lr_lag_scaling)
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

    # -- how a step's microbatches are spread (one device: all here; satrl.training.dp overrides these) --
    def _assigned(self, plan: list, mb: Batch) -> list[tuple[Micro, bool]]:
        """The microbatches this process runs, each with whether it is real (False: zero-weight padding)."""
        return [(p, True) for p in plan]

    def _gathered(self, plan: list, rows: int, losses: list, per_mb: list, tok: dict) -> tuple[list, list, dict]:
        """Every microbatch's loss and metrics in plan order, and the per-token tensors of all ``rows``, from
        the pieces this process ran (in :meth:`_assigned`'s order, padding included)."""
        return losses, per_mb, {k: torch.cat(v) for k, v in tok.items() if v}

    def engine_model(self) -> torch.nn.Module:
        """The policy as one module, for an engine to copy (its weights then come from :meth:`weights`)."""
        return self.model

    def write_shards(self, path) -> None:
        """Write the state kept in shards across processes into checkpoint folder ``path`` (none on one device)."""

    def read_shards(self, path) -> None:
        """Read what :meth:`write_shards` wrote (nothing on one device)."""

    def _grads_finite(self) -> torch.Tensor:
        """Whether every gradient is finite, as a 0-dim bool tensor (no sync)."""
        grads = [torch.isfinite(p.grad).all() for p in self.model.parameters() if p.grad is not None]
        return torch.stack(grads).all() if grads else torch.ones((), dtype=torch.bool, device=self.device)

    def _clip_grads(self) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))

    def _diagnostics(self, mb: Batch, lag: torch.Tensor, tok: dict, version_logp: torch.Tensor | None) -> dict:
        engine_routing = None
        if "routing" in tok:  # the engine's experts at the scoring positions, vs the ones this forward used
            pos = scoring_positions(mb.prompt_len, mb.mask.shape[1], mb.routing.shape[1])  # [B, T]
            engine_routing = mb.routing.gather(1, pos[:, :, None, None].expand(-1, -1, *mb.routing.shape[2:]))
        out = diag.step_diagnostics(
            logp=tok["logp"],
            behavior_logp=mb.behavior_logp,
            mask=mb.mask,
            lag=lag,
            tok={f"tok/{k}": tok[k] for k in ("gate", "clipped", "d") if k in tok},
            logp_at_version=version_logp,
            engine_routing=engine_routing,
            trainer_routing=tok.get("routing"),
        )
        return {k: float(v) for k, v in out.items()}
