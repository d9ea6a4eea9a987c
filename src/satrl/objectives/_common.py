"""Small masked-tensor helpers shared by the objective modules.

Masked positions (``mask`` False) may hold any value, NaN and inf included. Every helper here selects
with ``torch.where`` (never multiplies by the mask), so garbage cannot leak into values or gradients:
``where``'s backward sends exactly zero to the branch it did not pick.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Log-ratios are clamped to this range before ``exp``: e^20 ~ 4.9e8 is far beyond any clip bound, yet
# finite in float32 and bfloat16, so very stale tokens cannot overflow. Tokens beyond it get zero
# gradient through the clamp (they are far outside every trust region anyway).
LOG_RATIO_CLAMP = 20.0


def as_bool_mask(mask: Tensor) -> Tensor:
    """The mask as a bool tensor (accepts bool, int or float masks)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked(x: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """``x`` on active positions, ``fill`` elsewhere (garbage-safe, gradient-safe)."""
    return torch.where(mask, x, torch.as_tensor(fill, dtype=x.dtype, device=x.device))


def count(mask: Tensor) -> Tensor:
    """Number of active tokens as a 0-dim float tensor, at least 1 (so empty masks give 0, not NaN)."""
    return mask.sum().clamp(min=1).to(torch.float32)


def masked_mean(x: Tensor, mask: Tensor, n: Tensor | None = None) -> Tensor:
    """Mean of ``x`` over active positions (0 when there are none). 0-dim, float32."""
    n = count(mask) if n is None else n
    return masked(x, mask).sum(dtype=torch.float32) / n


def masked_frac(flag: Tensor, mask: Tensor, n: Tensor | None = None) -> Tensor:
    """Share of active positions where the bool ``flag`` holds. 0-dim, float32."""
    n = count(mask) if n is None else n
    return (flag & mask).sum().to(torch.float32) / n


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over active positions (-inf when there are none). 0-dim."""
    return masked(x, mask, float("-inf")).max()


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence mean over active tokens: [B, T] -> [B] (0 for empty sequences)."""
    lengths = mask.sum(-1).clamp(min=1)
    return masked(x, mask).sum(-1) / lengths.to(x.dtype)


def expand_adv(adv: Tensor, like: Tensor) -> Tensor:
    """Advantages as [B, T]: a per-sequence [B] advantage is broadcast to the response's tokens."""
    if adv.dim() == 1:
        return adv[:, None].expand_as(like)
    if adv.shape != like.shape:
        raise ValueError(f"adv must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(adv.shape)}")
    return adv
