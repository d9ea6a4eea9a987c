"""KL regularizer against a reference policy, per token (Schulman's estimators, "low-variance KL" = k3).

With x = log pi_ref - log pi (clamped to +-20 before ``exp``):
- ``k1``: -x = log pi - log pi_ref
- ``k2``: x^2 / 2
- ``k3``: exp(x) - x - 1 (the paper's low-variance KL, coefficient 1e-3, Appendix F)

A KL function maps ``(logp, ref_logp, mask)`` to the per-token term [B, T] (differentiable in ``logp``,
0 on masked positions). For sequence-level ratios (GSPO) the objective broadcasts the sequence mean of
this term to the response's tokens (Appendix F: "a sequence-level mean KL ... broadcast to all active
tokens"). The term is only added when the caller passes ``ref_logp``; with ``ref_logp=None`` it is
skipped silently, whatever ``kl_coef`` is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import masked

from ._common import LOG_RATIO_CLAMP


def _log_ratio(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    return masked(ref_logp.detach() - logp, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def no_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> None:
    return None


def kl_k1(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    return -_log_ratio(logp, ref_logp, mask)


def kl_k2(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    return 0.5 * _log_ratio(logp, ref_logp, mask).square()


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    x = _log_ratio(logp, ref_logp, mask)
    return torch.exp(x) - x - 1.0
