"""verl's rollout-correction rejection masks, as corrections (verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py::
compute_rollout_rejection_mask``; Liu et al. 2025, "When Speed Kills Stability").

A rejection mask drops tokens or whole responses whose divergence between the trainer's policy and the
behaviour policy is out of bounds; kept tokens get weight 1 (no importance weight: verl's ``decoupled_geo_rs``
and ``decoupled_k3_rs`` recipes set ``rollout_is=None``). With lr = clip(log pi_old - log mu, +-20) per token
([B, T]; pi_old is the trainer's ``old_logp``, which both corrections declare, so the ratio's denominator
is pi_old as in verl's decoupled mode), verl's per-token statistics are::

    k1 = -lr            k2 = lr^2 / 2            k3 = e^lr - 1 - lr

and a level reduces them over the response's active tokens: ``token`` (none), ``seq_sum``, ``seq_mean``,
``seq_max`` (k2, k3 only). A k1 statistic is kept when log(low) <= s <= log(high) (bounds on the ratio
mu / pi_old); a k2 or k3 statistic when s <= threshold. A sequence statistic keeps or drops every token
of its response.

- ``geo_mask`` (verl's "Geo-RS", ``seq_mean_k1``): the response's geometric-mean ratio within
  [low, high] = [0.999, 1.001], verl's ``decoupled_geo_rs`` default.
- ``kl_mask`` (verl's "K3-RS", ``seq_mean_k3``): the response's mean k3 at most 0.01, verl's
  ``decoupled_k3_rs`` default (the level and the estimator, k2 or k3, are parameters).

Departure: verl removes rejected tokens from ``response_mask``, so its token-mean divides by the kept
tokens; here, as every correction, a rejected token has weight 0 and still counts in the aggregation's
denominator (AReaL's rejection does the same). The masks equal verl's own function (tested where verl is
importable).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from satrl.tensors import count, lengths, masked, masked_frac, masked_mean

from ._common import LOG_RATIO_CLAMP
from .trust_regions import ObjectiveInputs


@torch.no_grad()
def rejection_statistic(log_ratio: Tensor, mask: Tensor, estimator: str, level: str) -> Tensor:
    """verl's statistic for ``{level}_{estimator}`` on lr = log pi_old - log mu, broadcast to [B, T]
    ([B, T] -> [B, T]; a sequence statistic is 0 for a response with no active token)."""
    lr = masked(log_ratio, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        tok = -lr
    elif estimator == "k2":
        tok = 0.5 * lr.square()
    else:
        tok = torch.exp(lr) - 1.0 - lr
    tok = masked(tok, mask)
    if level == "token":
        return tok
    if level == "seq_sum":
        s = tok.sum(-1)
    elif level == "seq_mean":
        s = tok.sum(-1) / lengths(mask).clamp(min=1).to(tok.dtype)
    else:  # seq_max, over active tokens; 0 for an empty response
        s = masked(tok, mask, float("-inf")).max(-1).values
        s = torch.where(s == float("-inf"), 0.0, s)
    return s[:, None].expand_as(tok)


@torch.no_grad()
def rejection_keep(stat: Tensor, estimator: str, low: float | None, high: float) -> Tensor:
    """Which statistics verl keeps: log(low) <= s <= log(high) for k1, s <= high for k2 and k3."""
    if estimator == "k1":
        return (stat >= math.log(low)) & (stat <= math.log(high))
    return stat <= high


def _mask_correction(inp: ObjectiveInputs, estimator: str, level: str, low: float | None, high: float, prefix: str):
    stat = rejection_statistic(inp.old_logp.detach() - inp.behavior_logp, inp.mask, estimator, level)
    dropped = ~rejection_keep(stat, estimator, low, high) & inp.mask
    n = count(inp.mask)
    metrics = {f"{prefix}_mask_frac": masked_frac(dropped, inp.mask, n),
               f"{prefix}_stat_mean": masked_mean(stat, inp.mask, n)}  # fmt: skip
    return torch.where(dropped, 0.0, 1.0).to(inp.logp.dtype), dropped, metrics


@torch.no_grad()
def geo_mask_correction(inp: ObjectiveInputs, *, geo_level, geo_low, geo_high):
    """verl's ``{geo_level}_k1`` rejection (default ``seq_mean_k1``, [0.999, 1.001]): weight 0 on dropped tokens."""
    return _mask_correction(inp, "k1", geo_level, geo_low, geo_high, "geo")


@torch.no_grad()
def kl_mask_correction(inp: ObjectiveInputs, *, kl_estimator, kl_level, kl_threshold):
    """verl's ``{kl_level}_{kl_estimator}`` rejection (default ``seq_mean_k3`` <= 0.01): weight 0 on dropped tokens."""
    return _mask_correction(inp, kl_estimator, kl_level, None, kl_threshold, "kl")
