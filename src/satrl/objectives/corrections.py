"""Corrections: a detached per-token weight on the policy-gradient term for train/inference mismatch.

The weight is built from k = pi_old / mu = exp(old_logp - behavior_logp) (paper Eqs. 41-42), where
``old_logp`` is the trainer's recomputed log-prob (``logp.detach()`` when the caller gives none) and mu
the engine's. ``correction_level="sequence"`` replaces k by the length-normalized sequence weight
exp(mean_t log k) broadcast to the response (our choice: the geometric mean, as GSPO's ratio, so that long
responses do not explode; a raw product is not offered).

A correction function has the signature ``fn(inp, **params) -> (weight [B, T], dropped [B, T] bool,
metrics)``: ``weight`` is detached and 1 on masked positions, ``dropped`` marks active tokens it zeroes.

- ``tis`` (Yao et al. 2025): w = min(k, C), C = ``tis_cap`` = 2.
- ``icepop`` (Ling team 2025): w = 1{a <= k <= b}, [a, b] = [0.5, 2]; ``icepop_weighted=True`` gives
  the paper's Eq. 42 form k * 1{a <= k <= b}.
- ``mis`` (masked importance sampling): w = k * 1{k <= C}, C = ``mis_threshold`` = 2: TIS that drops
  instead of truncating.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import masked, masked_frac, masked_max, masked_mean, seq_mean

from ._common import LOG_RATIO_CLAMP
from .trust_regions import ObjectiveInputs


@torch.no_grad()
def mismatch_weight(inp: ObjectiveInputs, level: str) -> Tensor:
    """k = exp(clamp(log pi_old - log mu)) per token, or its sequence geometric mean.  # [B, T]"""
    log_k = masked(inp.old_logp.detach() - inp.behavior_logp, inp.mask)
    if level == "sequence":
        log_k = masked(seq_mean(log_k, inp.mask)[:, None].expand_as(log_k), inp.mask)
    return log_k.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def no_correction(inp: ObjectiveInputs):
    return None, None, {}


@torch.no_grad()
def tis_correction(inp: ObjectiveInputs, *, tis_cap, correction_level):
    """Truncated importance sampling: w = min(k, C)."""
    k = mismatch_weight(inp, correction_level)
    w = k.clamp(max=tis_cap)
    metrics = {
        "tis_mean": masked_mean(w, inp.mask),
        "tis_max": masked_max(k, inp.mask).to(torch.float32),
        "tis_clipfrac": masked_frac(k > tis_cap, inp.mask),
    }
    return masked(w, inp.mask, 1.0), None, metrics


@torch.no_grad()
def icepop_correction(inp: ObjectiveInputs, *, icepop_low, icepop_high, icepop_weighted, correction_level):
    """IcePop: drop tokens whose k lies outside [a, b] (binary, or k-weighted in range)."""
    k = mismatch_weight(inp, correction_level)
    keep = (k >= icepop_low) & (k <= icepop_high)
    w = torch.where(keep, k if icepop_weighted else torch.ones_like(k), torch.zeros_like(k))
    dropped = ~keep & inp.mask
    metrics = {
        "icepop_mask_frac": masked_frac(dropped, inp.mask),
        "icepop_mean": masked_mean(k, inp.mask),
        "icepop_max": masked_max(k, inp.mask).to(torch.float32),
    }
    return masked(w, inp.mask, 1.0), dropped, metrics


@torch.no_grad()
def mis_correction(inp: ObjectiveInputs, *, mis_threshold, correction_level):
    """Masked importance sampling: w = k where k <= C, else 0."""
    k = mismatch_weight(inp, correction_level)
    keep = k <= mis_threshold
    dropped = ~keep & inp.mask
    metrics = {
        "mis_mask_frac": masked_frac(dropped, inp.mask),
        "mis_mean": masked_mean(k, inp.mask),
        "mis_max": masked_max(k, inp.mask).to(torch.float32),
    }
    return masked(torch.where(keep, k, torch.zeros_like(k)), inp.mask, 1.0), dropped, metrics
