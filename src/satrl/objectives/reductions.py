"""How each scalar metric of an objective combines over microbatches.

A trainer that accumulates gradients over several microbatches gets one metrics dict per microbatch. Most
metrics are token means and combine as a token-weighted mean; extremes do not: the minimum of SAT's
contraction ``c_min`` over a step is the minimum of the microbatch minima, not their mean (a mean of minima
can exceed the documented bound of 1/2). Each metric that is not a mean is declared here, next to the code
that emits it being the only other place its name appears; a test checks that every ``*_min``/``*_max``
metric any preset emits is declared.
"""

from __future__ import annotations

import torch

REDUCTIONS: dict[str, str] = {
    "c_min": "min",  # sat.py: smallest contraction factor psi among gated tokens
    "tis_max": "max",  # corrections.py: largest truncated IS weight
    "icepop_max": "max",
    "mis_max": "max",
    "behav_imp_max": "max",  # repairs.py: largest raw behaviour weight pi_prox / mu (decoupled PPO, A-3PO)
}
_OPS = {"min": torch.minimum, "max": torch.maximum}


def reduction_of(key: str) -> str:
    """``"mean"`` (token-weighted), ``"min"`` or ``"max"`` for a metric name (without the ``obj/`` prefix)."""
    return REDUCTIONS.get(key, "mean")


def reduce_metrics(per_microbatch: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Combine 0-dim metric tensors over microbatches without a device sync: token-weighted means in float64,
    accumulated in microbatch order (the same arithmetic as a Python float sum), and declared extremes.

    Args:
        per_microbatch: one dict of 0-dim tensors per microbatch (keys may differ between microbatches).
        weights: each microbatch's share of the step's active tokens.
    """
    out: dict[str, torch.Tensor] = {}
    for metrics, w in zip(per_microbatch, weights, strict=True):
        for k, v in metrics.items():
            how = reduction_of(k)
            v = v.detach().to(torch.float64)
            if how == "mean":
                term = v * w
                out[k] = term if k not in out else out[k] + term
            else:
                out[k] = v if k not in out else _OPS[how](out[k], v)
    return out
