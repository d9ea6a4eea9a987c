"""Trust regions: how the surrogate limits the update of each token.

A trust-region function has the signature
``fn(ratio, d, adv, mask, inp, **params) -> (loss_tok [B, T], clipped [B, T] bool, metrics)``:
``ratio`` is differentiable, ``d`` its detached log, ``adv`` is [B, T] (0 on masked positions),
``inp`` the :class:`ObjectiveInputs` (for log-probs and lags). ``clipped`` marks active tokens whose
surrogate gradient the trust region zeroes. Losses are minimized: loss = -surrogate.

Registered: ``ppo`` (PPO clip, optional dual clip), ``sat`` (paper Eqs. 13-19; in ``sat.py``, next to
its gate and its dense reference), ``dppo_tv``/``dppo_kl``
(Qi et al. 2026, arXiv 2602.04879, binary approximations) and ``ppo_dtv_mask`` (the SAT paper's DPPO
baseline, Appendix E.4/F: GRPO clip times a hard mask on outward tokens with |pi - mu| > delta).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from satrl.tensors import count, masked, masked_frac

from .registry import component_registry, dual_clip_ok, non_negative, unit_interval

TRUST_REGIONS = component_registry("trust region")


@dataclass(frozen=True)
class ObjectiveInputs:
    """The raw tensors of one call, for components that need more than the ratio. All [B, T]."""

    logp: Tensor  # trainer log-prob, carries the gradient
    denom_logp: Tensor  # the ratio's denominator: old_logp if given, else behavior_logp (detached)
    behavior_logp: Tensor  # engine log-prob mu (detached)
    old_logp: Tensor  # trainer log-prob at the start of the step; logp.detach() when not given
    mask: Tensor  # bool
    lag: Tensor | None = None  # per-token lag (trainer version - sample version)
    adv: Tensor | None = None  # cleaned advantage, [B, 1] or [B, T] (for corrections that need its sign)
    abs_d: Tensor | None = None  # |d| of the ratio level's log-ratio, if the caller has it (0 on masked)
    n_active: Tensor | None = None  # count_nonzero(mask), if the caller has it (counted once per call)

    @property
    def n(self) -> Tensor:
        """Active tokens as a 0-dim float32 tensor, at least 1 (:func:`satrl.tensors.count`)."""
        return count(self.mask) if self.n_active is None else self.n_active.clamp(min=1).to(torch.float32)


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, lo: Tensor | float, hi: Tensor | float, dual_clip: float | None = None
) -> Tensor:
    """PPO clipped loss per token: -min(r*A, clip(r, lo, hi)*A).   # [B, T]

    With ``dual_clip`` c > 1 (Ye et al. 2020), tokens with A < 0 are further bounded: loss <= -c*A, which
    zeroes the gradient of A < 0 tokens whose ratio exceeds c. ``lo``/``hi`` may be floats or [B, T].
    """
    if isinstance(lo, Tensor) != isinstance(hi, Tensor):
        lo, hi = torch.as_tensor(lo, dtype=ratio.dtype), torch.as_tensor(hi, dtype=ratio.dtype)
    neg_adv = -adv
    loss = torch.maximum(ratio * neg_adv, torch.clamp(ratio, lo, hi) * neg_adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, dual_clip * neg_adv), loss)
    return loss


@torch.no_grad()
def clip_flags(
    ratio: Tensor, adv: Tensor, mask: Tensor, lo: Tensor | float, hi: Tensor | float, dual_clip: float | None,
    n: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Which active tokens the clip zeroes: A > 0 above ``hi``, A < 0 below ``lo`` (or above the dual clip).
    ``n``: the active-token count (:func:`satrl.tensors.count`), if the caller has it."""
    clipped, metrics = _clip_flags_all(ratio, adv, mask, lo, hi, dual_clip, n)
    return clipped & mask, metrics


def _clip_flags_all(ratio, adv, mask, lo, hi, dual_clip, n=None):
    """:func:`clip_flags` on every position, masked or not (what the surrogate's gradient needs: a masked
    position may hold any ratio), with the fractions over active tokens."""
    r = ratio.detach()
    n = count(mask) if n is None else n
    high = (adv > 0) & (r > hi)
    low = (adv < 0) & (r < lo)
    clipped = high | low
    if dual_clip is not None:
        clipped |= (adv < 0) & (r > dual_clip)
    return clipped, {"clipfrac_high": masked_frac(high, mask, n), "clipfrac_low": masked_frac(low, mask, n)}


class _Surrogate(torch.autograd.Function):
    """:func:`clipped_surrogate` with its gradient written out: d loss / d ratio = -A on tokens the clip
    keeps, 0 on ``clipped`` ones, equal bit for bit to autograd's through ``maximum``/``clamp`` (tested). At
    an exact tie with a bound the two halves of ``maximum``'s split gradient add up to -A; at an exact tie
    with the dual clip (r = c, A < 0) ``minimum`` passes half of it, and so does this. Where r is past a bound
    but the two branches' products round to the same value (bfloat16, or within an ulp in float32), autograd
    splits the gradient; this keeps the branch that is larger in exact arithmetic. One multiply and one
    fill in backward instead of autograd's graph of ``where``s, and no [B, T] copy for a sparse override
    (SAT's fix-up: ``value`` written at flat positions ``pos``, already marked in ``clipped``)."""

    @staticmethod
    def forward(ctx, ratio, adv, clipped, lo, hi, dual_clip, pos, value):
        loss = clipped_surrogate(ratio, adv, lo, hi, dual_clip)
        if pos is not None:  # flat positions are row-major: a permuted layout is copied first
            loss = loss.contiguous()
            loss.view(-1).index_copy_(0, pos, value.to(loss.dtype))
        tie = None
        if dual_clip is not None:
            tie = (ratio == dual_clip) & (adv < 0)
            tie = tie if bool(tie.any()) else None
        ctx.save_for_backward(adv, clipped, tie)
        return loss

    @staticmethod
    def backward(ctx, grad):
        adv, clipped, tie = ctx.saved_tensors
        grad = (grad * -adv).masked_fill_(clipped, 0.0)
        if tie is not None:
            grad = torch.where(tie, grad * 0.5, grad)
        return grad, None, None, None, None, None, None, None


def _clip(ratio, adv, mask, lo, hi, dual_clip, override=None, n=None):
    """PPO's clipped loss, clipped flags and clip fractions. ``override``: (flat positions, values) whose loss
    is the given constant with zero gradient (SAT's fix-up), counted as clipped but not in the fractions."""
    clipped_all, metrics = _clip_flags_all(ratio, adv, mask, lo, hi, dual_clip, n)
    pos, value = (None, None) if override is None else override
    if pos is not None:
        clipped_all = clipped_all.contiguous()  # row-major, as the flat positions
        clipped_all.view(-1).index_fill_(0, pos, True)  # override positions are active tokens
    loss = _Surrogate.apply(ratio, adv, clipped_all, lo, hi, dual_clip, pos, value)
    return loss, clipped_all & mask, metrics


_EPS = {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None}
_EPS_CHECKS = {
    "eps_low": (unit_interval, "in [0, 1]"),
    "eps_high": (non_negative, ">= 0"),
    "dual_clip": (dual_clip_ok, "None or a number > 1"),
}


@TRUST_REGIONS.register("ppo", defaults=_EPS, checks=_EPS_CHECKS)
def ppo_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, dual_clip):
    """PPO clip with fixed radii: bounds [1 - eps_low, 1 + eps_high]."""
    return _clip(ratio, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip, n=inp.n)


@torch.no_grad()
def outward_drop(adv: Tensor, diff: Tensor, div: Tensor, delta: float, mask: Tensor) -> Tensor:
    """Tokens whose update moves pi away from mu (sign(A) = sign(pi - mu)) with divergence ``div`` > delta."""
    outward = ((adv > 0) & (diff > 0)) | ((adv < 0) & (diff < 0))
    return outward & (div > delta) & mask


def _probs(inp: ObjectiveInputs) -> tuple[Tensor, Tensor]:
    """(log pi, log mu) of the sampled token, detached; masked positions hold 0 (garbage-safe)."""
    lp = masked(inp.logp.detach(), inp.mask)
    lmu = masked(inp.denom_logp, inp.mask)
    return lp, lmu


def _masked_surrogate(ratio, adv, mask, drop, base_loss=None):
    """Loss with dropped tokens set to 0 (no value, no gradient); base is the unclipped -r*A."""
    loss = ratio * -adv if base_loss is None else base_loss
    loss = torch.where(drop, torch.zeros((), dtype=loss.dtype), loss)
    metrics = {
        "dppo_mask_frac": masked_frac(drop, mask),
        "clipfrac_high": masked_frac(drop & (adv > 0), mask),
        "clipfrac_low": masked_frac(drop & (adv < 0), mask),
    }
    return loss, metrics


@TRUST_REGIONS.register("dppo_tv", defaults={"delta": 0.15}, checks={"delta": (non_negative, ">= 0")})
def dppo_tv_trust_region(ratio, d, adv, mask, inp, *, delta):
    """DPPO-Binary-TV: loss -r*A, masked where the update is outward and |pi - mu| > delta."""
    lp, lmu = _probs(inp)
    diff = lp.exp() - lmu.exp()
    drop = outward_drop(adv, diff, diff.abs(), delta, mask)
    loss, metrics = _masked_surrogate(ratio, adv, mask, drop)
    return loss, drop, metrics


@TRUST_REGIONS.register("dppo_kl", defaults={"delta": 0.05}, checks={"delta": (non_negative, ">= 0")})
def dppo_kl_trust_region(ratio, d, adv, mask, inp, *, delta):
    """DPPO-Binary-KL: as DPPO-TV with the Bernoulli KL(mu || pi) of the sampled token as divergence."""
    with torch.no_grad():
        lp, lmu = _probs(inp)
        p, mu = lp.exp(), lmu.exp()
        # KL(Bern(mu) || Bern(p)) via xlogy, so 0 * log 0 = 0; 1 - p from expm1 for precision near p = 1.
        one_p, one_mu = -torch.expm1(lp), -torch.expm1(lmu)
        kl = (mu * (lmu - lp) + torch.special.xlogy(one_mu, one_mu) - torch.special.xlogy(one_mu, one_p))
        drop = outward_drop(adv, p - mu, kl, delta, mask)
    loss, metrics = _masked_surrogate(ratio, adv, mask, drop)
    return loss, drop, metrics


@TRUST_REGIONS.register(
    "ppo_dtv_mask",
    defaults={**_EPS, "delta": 1e-3},
    checks={**_EPS_CHECKS, "delta": (non_negative, ">= 0")},
)
def ppo_dtv_mask_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, dual_clip, delta):
    """The SAT paper's DPPO baseline: PPO clip times a hard mask on outward tokens with mu*|r - 1| > delta.

    mu*|r - 1| = |pi - mu| is the sampled-token TV discriminator (paper Eq. 45), r the token ratio.
    """
    lp, lmu = _probs(inp)
    diff = lp.exp() - lmu.exp()
    drop = outward_drop(adv, diff, diff.abs(), delta, mask)
    base = clipped_surrogate(ratio, adv, 1.0 - eps_low, 1.0 + eps_high, dual_clip)
    loss, metrics = _masked_surrogate(ratio, adv, mask, drop, base_loss=base)
    clipped, clip_metrics = clip_flags(ratio, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip)
    clipped = clipped | drop
    metrics["clipfrac_high"] = masked_frac(clipped & (adv > 0), mask)
    metrics["clipfrac_low"] = masked_frac(clipped & (adv < 0), mask)
    return loss, clipped, metrics
