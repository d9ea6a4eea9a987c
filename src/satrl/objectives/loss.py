"""The objective's loss on tensors: a resolved :class:`~satrl.objectives.presets.ObjectiveSpec`'s four components
composed (ratio level, trust region, correction, KL), the per-token outputs and the ratio metrics.

:meth:`ObjectiveSpec.__call__ <satrl.objectives.presets.ObjectiveSpec.__call__>` calls :func:`objective_loss`, so
that the spec, which the config validates, imports no torch; the components' functions are found through the spec
(:attr:`satrl.objectives.registry.Component.fn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from satrl.tensors import as_bool_mask, clean_adv, masked, masked_frac, masked_mean, seq_mean

from .trust_regions import ObjectiveInputs

__all__ = ["ObjectiveOutput", "TokenOutputs", "objective_loss"]


@dataclass(frozen=True)
class TokenOutputs:
    """The objective's per-token outputs, all [B, T] and detached."""

    d: Tensor  # token log-ratio log pi - log mu (0 on masked positions), whatever the ratio's denominator
    gate: Tensor  # bool: tokens SAT's gate contracted (all False for objectives without a gate)
    clipped: Tensor  # bool: active tokens whose policy-gradient term is zeroed (clip, mask or correction)


class ObjectiveOutput(NamedTuple):
    """What an objective returns: the per-token loss [B, T] (0 on masked positions, differentiable in
    ``logp``), 0-dim detached metrics, and the per-token outputs."""

    loss: Tensor
    metrics: dict[str, Tensor]
    tokens: TokenOutputs


def objective_loss(
    spec: Any,
    *,
    logp: Tensor,
    behavior_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    lag: Tensor | None = None,
    old_logp: Tensor | None = None,
) -> ObjectiveOutput:
    """The per-token loss, metrics and per-token outputs of the resolved objective ``spec`` (an
    :class:`~satrl.objectives.presets.ObjectiveSpec`); arguments as :func:`~satrl.objectives.presets.policy_loss`'s."""
    mask = as_bool_mask(mask)
    for key, t in (("behavior_logp", behavior_logp), ("mask", mask), ("ref_logp", ref_logp),
                   ("old_logp", old_logp), ("lag", lag)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{key} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}")
    # Row-major copies of any other layout (no-ops when contiguous): reductions then add in the same order
    # and flat positions mean the same tokens, so results do not depend on how the inputs are stored.
    logp, behavior_logp, mask = logp.contiguous(), behavior_logp.detach().contiguous(), mask.contiguous()
    ref_logp, lag, old_logp = (None if t is None else t.contiguous() for t in (ref_logp, lag, old_logp))
    old = logp.detach() if old_logp is None else old_logp.detach()
    denom = behavior_logp if old_logp is None else old
    adv = clean_adv(adv.contiguous().detach(), mask)  # [B, 1] or [B, T], 0 where inactive

    ratio, d = spec.component("ratio").fn(logp, denom, mask)
    inp = ObjectiveInputs(logp, denom, behavior_logp, old, mask, lag, adv, n_active=torch.count_nonzero(mask))
    region = spec.component("trust_region").fn(ratio, d, adv, mask, inp, **spec.trust_region.kwargs())
    loss, metrics = region.loss, dict(region.metrics)
    weight, dropped, corr_metrics = spec.component("correction").fn(inp, **spec.correction.kwargs())
    metrics.update(corr_metrics)
    loss = loss if weight is None else loss * weight
    clipped = region.clipped if dropped is None else region.clipped | dropped

    coef = getattr(spec.kl, "coef", 0.0)
    if ref_logp is not None and coef > 0:
        kl_tok = spec.component("kl").fn(logp, ref_logp, mask)
        if spec.component("ratio").traits.get("per_sequence"):
            kl_tok = seq_mean(kl_tok, mask)[:, None].expand_as(kl_tok)  # GSPO: sequence-mean KL
        loss = loss + coef * kl_tok
        metrics["kl"] = masked_mean(kl_tok.detach(), mask)

    tok_d = masked(logp.detach() - behavior_logp, mask)  # [B, T] token log-ratio log pi - log mu
    metrics.update(_ratio_metrics(tok_d if old_logp is None else masked(logp.detach() - denom, mask),
                                  region.clipped, mask, inp.n))  # fmt: skip
    gate = torch.zeros_like(mask) if region.gate is None else region.gate
    return ObjectiveOutput(masked(loss, mask), metrics, TokenOutputs(tok_d, gate, clipped))


@torch.no_grad()
def _ratio_metrics(x: Tensor, clipped: Tensor, mask: Tensor, n: Tensor) -> dict[str, Tensor]:
    """clipfrac (of the trust region), ppo_kl and logratio_var of the optimized token log-ratio ``x``
    (0 on masked positions, so plain sums are masked sums)."""
    mean_x = x.sum(dtype=torch.float32) / n
    return {
        "clipfrac": masked_frac(clipped, mask, n),
        "ppo_kl": -mean_x,
        "logratio_var": (x.square().sum(dtype=torch.float32) / n - mean_x.square()).clamp(min=0.0),
    }
