"""The masked-tensor helpers of the objectives and the diagnostics, and the response positions.

Masked positions (``mask`` False) may hold any value, NaN and inf included (garbage from padding or a
previous batch). Every helper here removes them with ``torch.where`` *before* any arithmetic that could
spread them (``0 * nan`` is ``nan``, so multiplying by the mask is not enough), and ``where``'s backward
sends exactly zero to the branch it did not pick, so garbage leaks into neither values nor gradients.

Objectives compute in the input dtype with float32 accumulators (:func:`masked_mean`, :func:`masked_frac`);
diagnostics first :func:`clean` into a wide dtype (:func:`wide_dtype`) and average there (:func:`clean_mean`).

Response positions: response token t of batch row b is scored by the logits at input position
``prompt_len[b] - 1 + t`` (:func:`scoring_positions` for a batch, :func:`scoring_slice` for one sequence);
the engines record MoE routing at the same positions (docs/design.md, "R3").
"""

from __future__ import annotations

import torch
from torch import Tensor


# ---------------------------------------------------------------------------------------- positions
def scoring_positions(prompt_len: Tensor, T: int, L: int) -> Tensor:
    """Input position whose logits score response token t of row b: ``prompt_len[b] - 1 + t``, clamped to
    ``[0, L - 1]`` (padding past a row's end points at a valid position; its tokens are masked). [B] -> [B, T]."""
    return (prompt_len[:, None] - 1 + torch.arange(T, device=prompt_len.device)[None, :]).clamp(0, L - 1)


def scoring_slice(prompt_len: int, n: int) -> slice:
    """The input positions that score the ``n`` response tokens of one sequence (``prompt_len - 1 + t``)."""
    return slice(prompt_len - 1, prompt_len - 1 + n)


# ---------------------------------------------------------------------------------------- masks
def as_bool_mask(mask: Tensor) -> Tensor:
    """The mask as a bool tensor (accepts bool, int or float masks; nonzero = active)."""
    return mask if mask.dtype == torch.bool else mask != 0


def check_same_shape(mask: Tensor, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask has shape {tuple(mask.shape)}; "
                f"pass per-token tensors aligned with the mask ([B, T])"
            )


def flat_nonzero(flag: Tensor) -> Tensor:
    """Ascending flat positions where the bool ``flag`` holds, int64 [N] (a host sync on accelerators)."""
    return flag.reshape(-1).nonzero().squeeze(1)


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


# ---------------------------------------------------------------------------------------- diagnostics
def wide_dtype(device: torch.device) -> torch.dtype:
    """float64 for diagnostics (exact differences of float32 log-probs, see ``decompose_mismatch``);
    float32 on Apple MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def clean(x: Tensor, mask: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Detached copy of ``x`` (cast to ``dtype``) with inactive positions replaced by 0."""
    x = x.detach()
    if dtype is not None:
        x = x.to(dtype)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def clean_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of an already :func:`clean` ``x`` over active positions, in ``x``'s dtype; 0 when nothing is active."""
    n = mask.sum()
    return x.sum() / n.clamp(min=1).to(x.dtype)


def quantile_sorted(sorted_vals: Tensor, p: float) -> Tensor:
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
