"""Small masked-tensor helpers shared by the diagnostics.

Every diagnostic treats positions where ``mask`` is False as padding that may hold anything (NaN, inf,
garbage from a previous batch). They are removed with ``torch.where`` *before* any arithmetic that
could spread them (``0 * nan`` is ``nan``, so multiplying by the mask is not enough).
"""

from __future__ import annotations

import torch


def wide_dtype(device: torch.device) -> torch.dtype:
    """float64 for diagnostics (exact differences of float32 log-probs, see ``decompose_mismatch``);
    float32 on Apple MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """Accept bool or 0/1 float/int masks; nonzero = active."""
    return mask if mask.dtype == torch.bool else mask != 0


def check_same_shape(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask has shape {tuple(mask.shape)}; "
                f"pass per-token tensors aligned with the mask ([B, T])"
            )


def clean(x: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Detached copy of ``x`` (cast to ``dtype``) with inactive positions replaced by 0."""
    x = x.detach()
    if dtype is not None:
        x = x.to(dtype)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over active positions; 0 when nothing is active. ``x`` must already be clean."""
    n = mask.sum()
    return x.sum() / n.clamp(min=1).to(x.dtype)


def quantile_sorted(sorted_vals: torch.Tensor, p: float) -> torch.Tensor:
    """Linear-interpolation quantile of an ascending 1-D tensor (same rule as ``torch.quantile``'s
    default), written out because ``torch.quantile`` refuses inputs above 2**24 elements."""
    n = sorted_vals.numel()
    if n == 0:
        return torch.zeros((), dtype=sorted_vals.dtype, device=sorted_vals.device)
    pos = p * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * frac
