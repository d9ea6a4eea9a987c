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
    return torch.where(mask, x, fill)


def count(mask: Tensor) -> Tensor:
    """Number of active tokens as a 0-dim float tensor, at least 1 (so empty masks give 0, not NaN)."""
    return torch.count_nonzero(mask).clamp(min=1).to(torch.float32)


def masked_mean(x: Tensor, mask: Tensor, n: Tensor | None = None) -> Tensor:
    """Mean of ``x`` over active positions (0 when there are none). 0-dim, float32."""
    n = count(mask) if n is None else n
    return masked(x, mask).sum(dtype=torch.float32) / n


def masked_frac(flag: Tensor, mask: Tensor, n: Tensor | None = None) -> Tensor:
    """Share of active positions where the bool ``flag`` holds. 0-dim, float32."""
    n = count(mask) if n is None else n
    return torch.count_nonzero(flag & mask).to(torch.float32) / n  # count_nonzero: no int64 copy


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over active positions (-inf when there are none). 0-dim."""
    return masked(x, mask, float("-inf")).max()


def lengths(mask: Tensor) -> Tensor:
    """Active tokens per sequence, [B, T] -> [B] int32. (``mask.sum(-1)`` first converts the bool mask
    to an int64 copy of it, about 20x slower on CPU; the counts are the same.)"""
    return mask.sum(-1, dtype=torch.int32)


def seq_mean(x: Tensor, mask: Tensor, premasked: bool = False) -> Tensor:
    """Per-sequence mean over active tokens: [B, T] -> [B] (0 for empty sequences). ``premasked``:
    ``x`` is already exactly 0 on masked positions (skips a ``where``; same result)."""
    total = (x if premasked else masked(x, mask)).sum(-1)
    return total / lengths(mask).clamp(min=1).to(x.dtype)


def clean_adv(adv: Tensor, mask: Tensor) -> Tensor:
    """Garbage-free advantages, broadcastable to [B, T]: [B] -> [B, 1], [B, T] -> [B, T].

    A [B] advantage stays [B, 1] (no [B, T] copy); it is zeroed on responses with no active token.
    A [B, T] advantage is zeroed on masked positions.
    """
    if adv.dim() == 1 and adv.shape[0] == mask.shape[0]:
        return torch.where(mask.any(-1), adv, 0.0)[:, None]
    if adv.shape != mask.shape:
        raise ValueError(f"adv must be [B] or [B, T] = {tuple(mask.shape)}, got {tuple(adv.shape)}")
    return torch.where(mask, adv, 0.0)
