"""Ratio level: the importance ratio that enters the clipped surrogate (paper Eqs. 1, 20, 37).

A ratio function maps ``(logp, denom_logp, mask)`` to ``(ratio, d)``:
- ``ratio`` [B, T]: the ratio's value, differentiable in ``logp`` (1 at masked positions);
- ``d`` [B, T]: the detached log of that ratio, the scalar the trust region clips and SAT scores
  (0 at masked positions).

``denom_logp`` is the behaviour log-prob mu (default) or the trainer's recomputed old log-prob.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import masked, seq_mean

from ._common import LOG_RATIO_CLAMP


def token_ratio(logp: Tensor, denom_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """GRPO/PPO token ratio r_t = exp(clamp(logp_t - denom_t, +-20)).  # [B, T] -> [B, T], [B, T]"""
    d = masked(logp - denom_logp, mask)  # garbage-safe before exp: masked positions are exactly 0
    ratio = torch.exp(d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return ratio, d.detach()


def sequence_ratio(logp: Tensor, denom_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """GSPO length-normalized sequence ratio, broadcast to the response's tokens (paper Eq. 20).

    s_b = exp(mean_t d_bt) over active tokens. Gradient form is GSPO-token (Zheng et al. 2025, Eq. 13):
    s_bt = sg[s_b] * pi_t / sg[pi_t], i.e. log s_bt = sg[log s_b] + logp_t - sg[logp_t]; its value is s_b
    on every token and d s_bt / d logp_t = s_b. With ``seq-mean-token-mean`` aggregation the gradient is
    exactly GSPO's sequence-level gradient.  # [B, T] -> [B, T], [B, T]
    """
    lp = masked(logp, mask)
    tok_d = lp.detach() - masked(denom_logp, mask)  # 0 on masked positions
    log_s = seq_mean(tok_d, mask, premasked=True)  # [B]
    log_s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    d = masked(log_s[:, None].expand_as(lp), mask)  # [B, T], detached
    ratio = torch.exp(d + (lp - lp.detach()))
    return ratio, d

