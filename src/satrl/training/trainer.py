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

import torch

from satrl import diagnostics as diag
from satrl.objectives import ObjectiveSpec, aggregate
from satrl.objectives.aggregation import share_unit
from satrl.objectives.reductions import reduce_metrics
from satrl.tensors import scoring_positions
from satrl.training.advantages import group_advantages
from satrl.types import Batch

Snapshots = Callable[[int], "dict[str, torch.Tensor] | None"]


def response_logp(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    routing: torch.Tensor | None = None,  # [B, L, layers, top_k] to replay (R3), or None
    capture: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(y_t | s_t) of each response token [B, T], from temperature-scaled logits (the engine's
    sampler), and, if ``capture``, the experts each MoE layer used at the scoring positions [B, T, layers, k]."""
    L = int(mb.attention_mask.sum(1).max())
    T = mb.mask.shape[1]
    pos = scoring_positions(mb.prompt_len, T, L)  # [B, T]
    with contextlib.ExitStack() as stack:
        if routing is not None:
            from satrl.models.routing import replay_routing

            stack.enter_context(replay_routing(model, routing[:, :L]))
        rec = None
        if capture:
            from satrl.models.routing import capture_routing

            rec = stack.enter_context(capture_routing(model))  # inside replay: records the experts used
        out = model(input_ids=mb.input_ids[:, :L], attention_mask=mb.attention_mask[:, :L].long())
        used = None
        if rec is not None:
            r = rec.take()
            used = r.gather(1, pos[:, :, None, None].expand(-1, -1, *r.shape[2:]))
    logits = out.logits.gather(1, pos[..., None].expand(-1, -1, out.logits.shape[-1])).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, mb.response_ids[..., None]).squeeze(-1), used


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


def microbatches(mb: Batch, token_budget: int) -> Iterator[Batch]:
    """Consecutive rows whose padded length fits the budget (at least one row each)."""
    lengths = mb.attention_mask.sum(1)
    start = 0
    while start < lengths.numel():
        end, longest = start, 0
        while end < lengths.numel():
            longest_next = max(longest, int(lengths[end]))
            if end > start and longest_next * (end - start + 1) > token_budget:
                break
            longest, end = longest_next, end + 1
        yield split_rows(mb, torch.arange(start, end))
        start = end


def epoch_order(seed: int, index: int, epoch: int, n: int) -> torch.Tensor:
    """The row order of one pass over a batch: a permutation of ``n`` rows, distinct and reproducible for each
    (run seed, batch index, epoch). The mixing constants are arbitrary primes, kept so runs reproduce."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + index * 31 + epoch))


def _pick(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if x is None else x[rows]


class Trainer:
    """Owns the policy, its frozen reference and the optimizer. One :meth:`step` = one optimizer step."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: ObjectiveSpec,
        *,
        aggregation: str = "token-mean",
        lr: float,
        betas: tuple[float, float] = (0.9, 0.98),
        weight_decay: float = 0.0,
        grad_clip: float | None = 1.0,
        temperature: float = 1.0,
        microbatch_tokens: int = 4096,
        whole_batch_quantile: bool = False,
        r3: bool = False,
        recomputed_denominator: bool = False,
        device: str | torch.device = "cpu",
        minibatches: int = 1,
        ppo_epochs: int = 1,
        adv_std_norm: bool = True,
        decompose: bool = False,
        seed: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.float().to(self.device).train()
        uses_ref = "ref_logp" in objective.needs
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if uses_ref else None
        self.objective, self.aggregation = objective, aggregation
        # A correction (TIS, IcePop, MIS) weighs by pi_old/mu, so it needs pi_old: the trainer's own log-probs
        # at the start of the batch (the paper's Eq. 51 "recomputed" side), whatever the denominator option.
        self.needs_old_logp = recomputed_denominator or "old_logp" in objective.needs
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.temperature = temperature
        # The paper's quantile is per microbatch; "batch" scope runs the minibatch as one microbatch.
        self.microbatch_tokens = 1 << 62 if whole_batch_quantile else microbatch_tokens
        self.r3 = r3
        # How one rollout batch is trained (train_batch): ppo_epochs passes of `minibatches` optimizer steps.
        self.minibatches, self.ppo_epochs, self.adv_std_norm = minibatches, ppo_epochs, adv_std_norm
        self.decompose, self.seed = decompose, seed
        self.version = 0
        self.skipped = 0
        self._scratch: torch.nn.Module | None = None
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None  # (version, CPU copy): see weights()
        from satrl.models.routing import moe_num_layers

        self.is_moe = moe_num_layers(model) > 0

    # -- state -------------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """A detached CPU copy of the current weights, safe to hand to an engine or a checkpoint.

        Copied at most once per version: the loop pushes them to the engine and the snapshot store, the
        evaluator and the checkpoint read them at the same version, and all get the same dict (treat it as
        read-only). The copy is dropped at the next optimizer step, or when the weights are loaded."""
        if self._weights is None or self._weights[0] != self.version:
            self._weights = (self.version, cpu_copy(self.model))
        return self._weights[1]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights (resume from a checkpoint)."""
        self.model.load_state_dict(weights)
        self._weights = None

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
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
        """Log-probs under other weights (a snapshot), or under the current ones if ``state`` is None."""
        model = self.model
        if state is not None:
            if self._scratch is None:
                self._scratch = copy.deepcopy(self.model).eval()
            self._scratch.load_state_dict(state)
            model = self._scratch
        pieces = microbatches(to_device(mb, self.device), self.microbatch_tokens)
        return torch.cat([response_logp(model, m, self.temperature, self._routing(m))[0] for m in pieces]).cpu()

    @torch.no_grad()
    def version_logp(self, mb: Batch, snapshots: Snapshots) -> torch.Tensor | None:  # [B, T]
        """log pi^(l) for each row's own version l (for the d = Delta_pi + Delta_impl split)."""
        out = torch.zeros(mb.mask.shape)
        row_version = torch.where(mb.mask, mb.versions, mb.versions.min()).max(1).values
        for v in row_version.unique().tolist():
            state = snapshots(int(v))
            if state is None:
                return None
            rows = (row_version == v).nonzero().squeeze(1)
            out[rows] = self.logp_with(state, split_rows(mb, rows))
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
        adv = group_advantages(batch.rewards, batch.group_index, self.adv_std_norm)
        old_logp = self.logp_with(None, batch) if self.needs_old_logp else None
        vlogp = self.version_logp(batch, snapshots) if self.decompose else None
        for epoch in range(self.ppo_epochs):
            if self.version >= stop_at:
                return
            for rows in torch.tensor_split(epoch_order(self.seed, index, epoch, batch.mask.shape[0]), self.minibatches):
                yield self.step(split_rows(batch, rows), adv[rows], _pick(old_logp, rows), _pick(vlogp, rows)), rows
                if self.version >= stop_at:
                    return

    # -- one optimizer step ------------------------------------------------------------------------
    def step(
        self,
        mb: Batch,
        adv: torch.Tensor,  # [B]
        old_logp: torch.Tensor | None = None,  # [B, T] recomputed denominator, or None (rollout)
        version_logp: torch.Tensor | None = None,  # [B, T] log pi^(l), for the decomposition
    ) -> dict[str, float]:
        """Accumulate gradients over microbatches, guard against non-finite values, step once."""
        dev = self.device
        mb, adv = to_device(mb, dev), adv.to(dev)
        old_logp = None if old_logp is None else old_logp.to(dev)
        version_logp = None if version_logp is None else version_logp.to(dev)
        self.opt.zero_grad(set_to_none=True)
        self._weights = None  # the last version's CPU copy: whoever needs it holds it by now
        lag = (self.version - mb.versions).clamp(min=0)  # [B, T]
        n_tok = int(mb.mask.sum())
        n_seq = int(mb.mask.any(1).sum())
        seq_mode = share_unit(self.aggregation) == "sequence"
        rows, tok = 0, {"logp": [], "gate": [], "clipped": [], "d": [], "routing": []}
        total = torch.zeros((), dtype=torch.float64, device=dev)  # the loss, summed without a sync per microbatch
        per_mb: list[dict[str, torch.Tensor]] = []
        weights: list[float] = []
        for m in microbatches(mb, self.microbatch_tokens):
            sl = slice(rows, rows + m.mask.shape[0])
            rows = sl.stop
            logp, used = response_logp(self.model, m, self.temperature, self._routing(m), self.is_moe and m.routing is not None)
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = response_logp(self.ref_model, m, self.temperature, self._routing(m))[0]
            if used is not None:
                tok["routing"].append(used)
            out = self.objective(
                logp=logp,
                behavior_logp=m.behavior_logp,
                adv=adv[sl],
                mask=m.mask,
                ref_logp=ref_logp,
                lag=lag[sl],
                old_logp=None if old_logp is None else old_logp[sl],
            )
            share = (m.mask.any(1).sum() / max(n_seq, 1)) if seq_mode else (m.mask.sum() / max(n_tok, 1))
            loss = aggregate(out.loss, m.mask, self.aggregation) * share
            loss.backward()
            total = total + loss.detach().to(torch.float64)
            weights.append(float(m.mask.sum()) / max(n_tok, 1))  # host-side: the mask came from the CPU batch
            per_mb.append(out.metrics)
            for k in ("gate", "clipped", "d"):
                tok[k].append(getattr(out.tokens, k))
            tok["logp"].append(logp.detach())
        # One device sync for the guard, the loss and every metric: the metrics combine as each declares
        # (token mean, min or max; satrl.objectives.reductions), as tensors, then come to the host together.
        grads = [torch.isfinite(p.grad).all() for p in self.model.parameters() if p.grad is not None]
        reduced = reduce_metrics(per_mb, weights)
        keys = list(reduced)
        flags = torch.stack([torch.isfinite(total), *grads]).all() if grads else torch.isfinite(total)
        host = torch.stack([flags.to(torch.float64), total, *(reduced[k] for k in keys)]).tolist()
        finite, total = bool(host[0]), host[1]
        scalars = dict(zip(keys, host[2:]))
        if finite:
            if self.grad_clip is not None:
                scalars["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
            self.opt.step()
        else:  # never poison the model: weights and optimizer state stay untouched
            self.skipped += 1
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        out = {"loss": total, "skipped": float(not finite), **{f"obj/{k}": v for k, v in scalars.items()}}
        out.update(self._diagnostics(mb, lag, {k: torch.cat(v) for k, v in tok.items() if v}, version_logp))
        return out

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
