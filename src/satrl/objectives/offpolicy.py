"""The off-policy objectives other frameworks ship, as trust regions and one correction (composed by presets).

Signatures as in :mod:`.trust_regions` (``fn(ratio, d, adv, mask, inp, **params) -> (loss [B, T], clipped
[B, T] bool, metrics)``) and :mod:`.corrections`. ``r`` is the ratio level's ratio (token: pi/mu), ``d`` its
detached log, ``A`` the advantage; losses are minimized.

- ``cispo`` (CISPO, MiniMax-M1: Chen et al. 2025, arXiv 2506.13585, Eq. 4): REINFORCE weighted by the
  clipped, detached importance weight; no token loses its gradient, the clip only caps the weight::

      loss = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi        d loss / d log pi = -clip(r) A

- ``sapo`` (SAPO, Qwen: Gao et al. 2025, arXiv 2511.20347): a smooth gate instead of a hard clip::

      loss = -f(r) A,   f(r) = (4 / tau) sigmoid(tau (r - 1)),   tau = tau_pos if A > 0 else tau_neg
      d loss / d log pi = -4 s (1 - s) r A,  s = sigmoid(tau (r - 1))   (= -r A at r = 1, decays outside)

- ``gmpo`` (GMPO: Zhao et al. 2025, arXiv 2507.20673): the geometric mean of token ratios, each clipped
  in log space on its outward side *before* the mean (log r: token log-ratio, lr)::

      lc_t = min(lr_t, eps_high) if A_t > 0;  max(lr_t, -eps_low) if A_t < 0;  0 if A_t = 0
      S_b = exp(mean_t lc_bt);   loss_bt = -Abar_b * S_bt,  S_bt = exp(sg[log S_b] + lc_bt - sg[lc_bt])

  Abar_b is the response's mean advantage (A_b itself for a [B] advantage; GMPO is defined for
  sequence advantages, and verl's geo_mean does the same). S_bt has value S_b on every token and
  d S_bt / d lc_bt = S_b, so with ``seq-mean-token-mean`` aggregation the loss and gradient are GMPO's
  per-sequence objective -Abar_b S_b. log S_b is clamped to +-20 (verl does not clamp).
- ``m2po`` (M2PO: Zheng et al. 2025, arXiv 2510.01161, Algorithm 1, Eq. 5): the unclipped -r A, with
  tokens masked (value 0, no gradient) by second moment: among the "trust-region" tokens (A > 0 and
  d > 0, or A < 0 and d < 0) the largest d^2 are removed until the mean d^2 of the rest is <= tau_M2.
- correction ``opsm`` (off-policy sequence masking, DeepSeek-V3.2: DeepSeek-AI 2025, arXiv 2512.02556):
  drops a response when A < 0 and its mean log(mu / pi) > delta; every other token keeps weight 1.

``sat_cispo`` and ``sat_gmpo`` contract CISPO's / GMPO's clip interval per token with SAT's gate and
kernel (:mod:`.sat`), exactly as ``sat`` contracts PPO's: the sign-selected endpoint of a gated token
becomes 1 + eps_high c+ / 1 - eps_low c- (CISPO) or eps_high c+ / -eps_low c- (GMPO, log space).
SAPO (no interval) and M2PO (a mask, no interval) have nothing for SAT to contract.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import count, masked, masked_frac, seq_mean

from ._common import LOG_RATIO_CLAMP
from .sat import gate_of
from .trust_regions import ObjectiveInputs, Region


# ------------------------------------------------------------------------------------------- CISPO
def _cispo(ratio, adv, mask, inp, w):
    """-w A log pi with the detached weight w [B, T]; nothing is gradient-clipped."""
    loss = -w * adv * masked(inp.logp, mask)
    return loss, torch.zeros_like(mask)


@torch.no_grad()
def _weight_clipfrac(r: Tensor, mask: Tensor, lo, hi) -> dict[str, Tensor]:
    """Shares of active tokens whose IS weight is capped at the upper / lower bound."""
    n = count(mask)
    return {"is_clipfrac_high": masked_frac(r > hi, mask, n), "is_clipfrac_low": masked_frac(r < lo, mask, n)}


def cispo_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high) -> Region:
    """CISPO: loss = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A log pi (MiniMax-M1 Eq. 4)."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    r = ratio.detach()
    loss, clipped = _cispo(ratio, adv, mask, inp, torch.clamp(r, lo, hi))
    return Region(loss, clipped, _weight_clipfrac(r, mask, lo, hi))


def sat_cispo_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, **gate) -> Region:
    """CISPO with SAT's per-token interval: w = clip(r, 1 - eps_low c-, 1 + eps_high c+)."""
    g = gate_of(d, mask, inp, gate)
    r = ratio.detach()
    with torch.no_grad():
        lo, hi = g.bounds(1.0, eps_low, eps_high)
        w = torch.clamp(r, lo, hi)
        changed = w != torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high)  # weights SAT changed
    loss, clipped = _cispo(ratio, adv, mask, inp, w)
    metrics = {**_weight_clipfrac(r, mask, 1.0 - eps_low, 1.0 + eps_high), **g.metrics(eps_low, eps_high)}
    metrics["sat_clipfrac"] = masked_frac(changed, mask, g.n)
    return Region(loss, clipped, metrics, g.gate)


# -------------------------------------------------------------------------------------------- SAPO


def sapo_trust_region(ratio, d, adv, mask, inp, *, tau_pos, tau_neg) -> Region:
    """SAPO: loss = -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos if A > 0 else tau_neg."""
    tau = torch.where(adv > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = -gate * adv
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio.detach() - 1.0))
        scale = masked((4.0 * s * (1.0 - s)).expand_as(mask), mask)  # f'(r): 1 at r = 1
        metrics = {"sapo_grad_scale": scale.sum(dtype=torch.float32) / count(mask)}
    return Region(loss, torch.zeros_like(mask), metrics)


# -------------------------------------------------------------------------------------------- GMPO
def _gmpo(adv, mask, inp, lo, hi):
    """GMPO per-token loss with log-space bounds lo < 0 < hi (floats or [B, T]); also the detached
    token log-ratio and the [B, T] advantage, for the clip flags."""
    lr = masked(inp.logp - inp.denom_logp, mask)  # differentiable token log-ratio, 0 when masked
    adv_t = adv.expand_as(lr)
    lc = torch.where(adv_t > 0, lr.clamp(max=hi), torch.where(adv_t < 0, lr.clamp(min=lo), 0.0))
    log_s = seq_mean(lc.detach(), mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B], log S_b
    s_tok = torch.exp(log_s[:, None] + (lc - lc.detach()))  # value S_b, d/d lc = S_b
    abar = adv if adv.shape[-1] == 1 else seq_mean(adv, mask)[:, None]  # [B, 1]
    return -abar * s_tok, lr.detach(), adv_t


@torch.no_grad()
def _gmpo_flags(x: Tensor, adv_t: Tensor, mask: Tensor, lo, hi) -> tuple[Tensor, Tensor]:
    """Active tokens whose log-ratio GMPO clips (no gradient): A > 0 above hi, A < 0 below lo."""
    return (adv_t > 0) & (x > hi) & mask, (adv_t < 0) & (x < lo) & mask


def _flags(high: Tensor, low: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    n = count(mask)
    return high | low, {"clipfrac_high": masked_frac(high, mask, n), "clipfrac_low": masked_frac(low, mask, n)}


def gmpo_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high) -> Region:
    """GMPO: per-sequence -A exp(mean_t clip_outward(log r_t, -eps_low, eps_high)). Computes its own
    token log-ratios from ``inp`` (the ratio level's ``ratio`` is not used; use ``ratio="token"``)."""
    loss, x, adv_t = _gmpo(adv, mask, inp, -eps_low, eps_high)
    clipped, metrics = _flags(*_gmpo_flags(x, adv_t, mask, -eps_low, eps_high), mask)
    return Region(loss, clipped, metrics)


def sat_gmpo_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, **gate) -> Region:
    """GMPO with SAT's per-token log-space interval [-eps_low c-, eps_high c+]."""
    g = gate_of(d, mask, inp, gate)
    with torch.no_grad():
        lo, hi = g.bounds(0.0, eps_low, eps_high)
    loss, x, adv_t = _gmpo(adv, mask, inp, lo, hi)
    clipped, metrics = _flags(*_gmpo_flags(x, adv_t, mask, lo, hi), mask)
    base_high, base_low = _gmpo_flags(x, adv_t, mask, -eps_low, eps_high)
    metrics.update(g.metrics(eps_low, eps_high))
    metrics["sat_clipfrac"] = masked_frac(clipped & ~(base_high | base_low), mask)  # newly clipped by SAT
    return Region(loss, clipped, metrics, g.gate)


# -------------------------------------------------------------------------------------------- M2PO
@torch.no_grad()
def m2po_mask(d: Tensor, adv: Tensor, mask: Tensor, threshold: float) -> tuple[Tensor, dict[str, Tensor]]:
    """M2PO's Algorithm 1: which tokens to drop. [B, T] bool and metrics.

    Candidates are the trust-region tokens (A > 0 and d > 0, or A < 0 and d < 0). Removing the largest
    d^2 one at a time until the mean of the rest is <= ``threshold`` keeps exactly the longest prefix
    of the ascending-sorted d^2 whose mean is <= threshold (prefix means of a sorted list only grow),
    so it is one sort and one cumulative sum, no loop and no host sync.
    """
    cand = mask & (((adv > 0) & (d > 0)) | ((adv < 0) & (d < 0)))
    idx = cand.reshape(-1).nonzero().squeeze(1)
    m2 = d.reshape(-1).index_select(0, idx).double().square()
    sorted_m2, order = torch.sort(m2, stable=True)
    prefix_mean = sorted_m2.cumsum(0) / torch.arange(1, m2.numel() + 1, device=d.device, dtype=torch.float64)
    drop_sorted = prefix_mean > threshold
    drop = torch.zeros_like(mask).reshape(-1)
    drop.index_fill_(0, idx.index_select(0, order.masked_select(drop_sorted)), True)
    drop = drop.reshape(mask.shape)
    n_c = max(m2.numel(), 1)
    kept = sorted_m2.masked_fill(drop_sorted, 0.0)
    n_kept = (~drop_sorted).sum().clamp(min=1)
    metrics = {
        "m2po_mask_frac": masked_frac(drop, mask),
        "m2_before": (m2.sum() / n_c).float(),
        "m2_after": (kept.sum() / n_kept).float(),
    }
    return drop, metrics


def m2po_trust_region(ratio, d, adv, mask, inp, *, m2_threshold) -> Region:
    """M2PO: loss = -r A, 0 (no gradient) on the tokens :func:`m2po_mask` drops. Normalize by all
    active tokens (``token-mean``), as the paper does (its footnote 2)."""
    drop, metrics = m2po_mask(d, adv, mask, m2_threshold)
    loss = torch.where(drop, torch.zeros((), dtype=ratio.dtype), -adv * ratio)
    n = count(mask)
    metrics["clipfrac_high"] = masked_frac(drop & (adv > 0), mask, n)
    metrics["clipfrac_low"] = masked_frac(drop & (adv < 0), mask, n)
    return Region(loss, drop, metrics)


# -------------------------------------------------------------------------------------------- OPSM


@torch.no_grad()
def opsm_correction(inp: ObjectiveInputs, *, opsm_delta):
    """OPSM: weight 0 on responses with A < 0 and mean_t (log mu - log pi) > delta, else 1.

    mu is the behaviour (engine) log-prob, pi the current one; per token where A is [B, T].
    delta = 0.5: DeepSeek-V3.2 gives no value, TRL suggests 0.5.
    """
    if inp.adv is None:
        raise ValueError("the opsm correction needs the advantage (ObjectiveInputs.adv)")
    kl = seq_mean(masked(inp.behavior_logp - inp.logp.detach(), inp.mask), inp.mask)  # [B]
    keep = (inp.adv >= 0) | (kl <= opsm_delta)[:, None]
    dropped = ~keep & inp.mask
    n = count(inp.mask)
    metrics = {
        "opsm_mask_frac": masked_frac(dropped, inp.mask, n),
        "opsm_kl_mean": masked(kl[:, None].expand_as(inp.mask), inp.mask).sum(dtype=torch.float32) / n,
    }
    weight = torch.where(dropped, 0.0, 1.0).to(inp.logp.dtype)
    return weight, dropped, metrics
