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
from dataclasses import dataclass

import torch

from satrl import diagnostics as diag
from satrl.objectives import aggregate, policy_loss
from satrl.types import Batch

Snapshots = Callable[[int], "dict[str, torch.Tensor] | None"]


@dataclass(frozen=True)
class ObjectiveSpec:
    """Plain arguments for :func:`satrl.objectives.policy_loss`, taken from the config at the edge."""

    name: str
    overrides: dict
    aggregation: str = "token-mean"


def _replay(model: torch.nn.Module, routing: torch.Tensor | None):
    if routing is None:
        return contextlib.nullcontext()
    from satrl.models.routing import replay_routing

    return replay_routing(model, routing)


def response_logp(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    routing: torch.Tensor | None = None,  # [B, L, layers, top_k] to replay (R3), or None
) -> torch.Tensor:  # [B, T]
    """log pi(y_t | s_t) of each response token, from temperature-scaled logits (the engine's sampler)."""
    L = int(mb.attention_mask.sum(1).max())
    T = mb.mask.shape[1]
    with _replay(model, None if routing is None else routing[:, :L]):
        out = model(input_ids=mb.input_ids[:, :L], attention_mask=mb.attention_mask[:, :L].long())
    pos = (mb.prompt_len[:, None] - 1 + torch.arange(T)[None, :]).clamp(0, L - 1)  # [B, T]
    logits = out.logits.gather(1, pos[..., None].expand(-1, -1, out.logits.shape[-1])).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, mb.response_ids[..., None]).squeeze(-1)


def split_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The sub-batch of the given row indices (T kept, so per-token tensors line up across pieces)."""
    pick = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    pick["sample_ids"] = [batch.sample_ids[i] for i in rows.tolist()] if batch.sample_ids else []
    return Batch(**pick)


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


class Trainer:
    """Owns the policy, its frozen reference and the optimizer. One :meth:`step` = one optimizer step."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: ObjectiveSpec,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.98),
        weight_decay: float = 0.0,
        grad_clip: float | None = 1.0,
        temperature: float = 1.0,
        microbatch_tokens: int = 4096,
        whole_batch_quantile: bool = False,
        r3: bool = False,
        uses_ref: bool = True,
    ) -> None:
        self.model = model.float().train()
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if uses_ref else None
        self.objective = objective
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.temperature = temperature
        # The paper's quantile is per microbatch; "batch" scope runs the minibatch as one microbatch.
        self.microbatch_tokens = 1 << 62 if whole_batch_quantile else microbatch_tokens
        self.r3 = r3
        self.version = 0
        self.skipped = 0
        self._scratch: torch.nn.Module | None = None

    # -- state -------------------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the current weights, safe to hand to an engine."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])
        self.version, self.skipped = state["version"], state["skipped"]

    # -- log-probs ---------------------------------------------------------------------------------
    def _routing(self, mb: Batch) -> torch.Tensor | None:
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
        return torch.cat(
            [response_logp(model, m, self.temperature, self._routing(m)) for m in microbatches(mb, self.microbatch_tokens)]
        )

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

    # -- one optimizer step ------------------------------------------------------------------------
    def step(
        self,
        mb: Batch,
        adv: torch.Tensor,  # [B]
        old_logp: torch.Tensor | None = None,  # [B, T] recomputed denominator, or None (rollout)
        version_logp: torch.Tensor | None = None,  # [B, T] log pi^(l), for the decomposition
    ) -> dict[str, float]:
        """Accumulate gradients over microbatches, guard against non-finite values, step once."""
        self.opt.zero_grad(set_to_none=True)
        lag = (self.version - mb.versions).clamp(min=0)  # [B, T]
        n_tok = int(mb.mask.sum())
        n_seq = int(mb.mask.any(1).sum())
        seq_mode = self.objective.aggregation != "token-mean"
        rows, total, scalars, tok = 0, 0.0, {}, {"logp": [], "gate": [], "clipped": [], "d": []}
        for m in microbatches(mb, self.microbatch_tokens):
            sl = slice(rows, rows + m.mask.shape[0])
            rows = sl.stop
            logp = response_logp(self.model, m, self.temperature, self._routing(m))
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = response_logp(self.ref_model, m, self.temperature, self._routing(m))
            loss_tok, metrics = policy_loss(
                self.objective.name,
                logp=logp,
                behavior_logp=m.behavior_logp,
                adv=adv[sl],
                mask=m.mask,
                ref_logp=ref_logp,
                versions=lag[sl],
                old_logp=None if old_logp is None else old_logp[sl],
                **self.objective.overrides,
            )
            share = (m.mask.any(1).sum() / max(n_seq, 1)) if seq_mode else (m.mask.sum() / max(n_tok, 1))
            loss = aggregate(loss_tok, m.mask, self.objective.aggregation) * share
            loss.backward()
            total += float(loss.detach())
            weight = float(m.mask.sum()) / max(n_tok, 1)
            for k, v in metrics.items():
                if k.startswith("tok/"):
                    tok[k[4:]].append(v)
                else:
                    scalars[k] = scalars.get(k, 0.0) + float(v) * weight
            tok["logp"].append(logp.detach())
        finite = torch.isfinite(torch.tensor(total)) and all(
            torch.isfinite(p.grad).all() for p in self.model.parameters() if p.grad is not None
        )
        if finite:
            if self.grad_clip is not None:
                scalars["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
            self.opt.step()
        else:  # never poison the model: weights and optimizer state stay untouched
            self.skipped += 1
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        out = {"loss": total, "skipped": float(not finite), **{f"obj/{k}": v for k, v in scalars.items()}}
        out.update(self._diagnostics(mb, lag, {k: torch.cat(v) for k, v in tok.items()}, version_logp))
        return out

    def _diagnostics(self, mb: Batch, lag: torch.Tensor, tok: dict, version_logp: torch.Tensor | None) -> dict:
        mask, logp = mb.mask, tok["logp"]
        out = {f"lag/{k}": float(v) for k, v in diag.lag_stats(lag, mask).items()}
        per_token = {"clipfrac": tok["clipped"].float(), "gate_rate": tok["gate"].float(), "abs_d": tok["d"].abs()}
        out.update({f"bylag/{k}": float(v) for k, v in diag.by_lag(lag, mask, **per_token).items()})
        tv = diag.gate_tv_share(logp, mb.behavior_logp, tok["gate"], mask)
        out.update({f"gate/{k}": float(v) for k, v in tv.items() if k != "gate_rate"})
        out.update({f"mismatch/{k}": float(v) for k, v in diag.mismatch_stats(logp, mb.behavior_logp, mask).items()})
        if version_logp is not None:
            dec = diag.decompose_mismatch(logp, version_logp, mb.behavior_logp, mask)
            out.update({f"mismatch/{k}": float(v) for k, v in dec.items() if not isinstance(v, torch.Tensor) or v.dim() == 0})
        return out
