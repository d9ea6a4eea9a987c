"""SAT: the Staleness-Adaptive Trust Region's clip bounds (paper Section 4.2, Eqs. 13-17, Table 10).

    d = sg[log r]                                   # [B, T], the detached log-ratio (Eq. 13)
    s = |d|  (or a proxy score)                      # what the gate ranks
    q = the ceil(alpha*n)-th smallest s over the n active tokens   (Eq. 14, inverse-CDF order statistic)
    gate = q > 0 and s > q                           # strict: at most n - ceil(alpha*n) tokens
    c+ = psi(s; q) on gated tokens with d > 0, else 1   psi(u; q) = 1 / (1 + (u/q)^p)   (Eqs. 15-16)
    c- = psi(s; q) on gated tokens with d < 0, else 1
    lo = 1 - eps_low * c-,   hi = 1 + eps_high * c+  (Eq. 17; detached)

With s = |d| this is exactly the paper: u+ = [d]+ equals |d| when d > 0 and psi(0; q) = 1 otherwise.

Options beyond the paper (all off by default):
- ``score``: a proxy [B, T] replacing |d| (e.g. |pi - mu| or the lag). The gate ranks the score against
  the score's own quantile, psi is evaluated on score/q, and the side is still chosen by sign(d).
- ``invert``: the falsification control. It gates the *bottom* tail instead: with m = n - ceil(alpha*n)
  (the most tokens the normal gate can pick), q_lo is the (m+1)-th smallest score and gate = s < q_lo,
  so at most m tokens are gated (fewer with ties), the same budget as the normal gate. The kernel
  mirrors the normal one: psi is evaluated on q_lo/s (> 1 on gated tokens, infinite at s = 0), so gated
  tokens get c in (0, 1/2) in both modes and the *least* stale tokens are contracted the most.
  Tokens with d == 0 have no outward side and keep c = 1 in both modes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

from ._common import as_bool_mask, count


def quantile_rank(alpha: float, n: int) -> int:
    """k = ceil(alpha * n), computed exactly (0.7 * 10 is 7, not 7.000000000000001)."""
    return math.ceil(Fraction(repr(float(alpha))) * n)


def kth_smallest(values: Tensor, k: int) -> Tensor:
    """The k-th smallest entry (1-based) of a flat tensor, as a 0-dim tensor; 0 when k < 1.

    Uses ``kthvalue`` (a selection, O(n)), never ``torch.quantile``: quantile interpolates, which is not
    the inverse-CDF convention of Eq. 14, and refuses inputs above 16M elements.
    """
    if k < 1 or values.numel() == 0:
        return values.new_zeros(())
    return values.kthvalue(min(k, values.numel())).values


@torch.no_grad()
def sat_clip_bounds(
    d: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    alpha: float = 0.9,
    exponent: float = 2.0,
    invert: bool = False,
    score: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """SAT's adaptive clip interval [lo, hi] per token (detached).

    Args:
        d: [B, T] log-ratio log r (treated as detached; masked positions may hold garbage).
        mask: [B, T] active tokens.
        score: optional [B, T] non-negative proxy replacing |d| for the gate and the kernel.
    Returns:
        lo, hi: [B, T] bounds (base radii on masked and ungated positions);
        metrics: ``q``, ``gate_rate``, ``eps_low_mean``, ``eps_high_mean``, ``c_min`` (paper Table 10,
        0-dim) and ``tok/gate`` ([B, T] bool).
    """
    mask = as_bool_mask(mask)
    d = d.detach()
    s = d.abs() if score is None else score.detach().to(d.dtype)
    s_act = s[mask]  # [n]: only active tokens enter the order statistic
    n = s_act.numel()
    k = quantile_rank(alpha, n)
    if invert:
        m = n - k  # gate budget, identical to the normal mode's
        q = kth_smallest(s_act, m + 1) if m > 0 else s.new_zeros(())
        gate = mask & (s < q)
    else:
        q = kth_smallest(s_act, k)
        gate = mask & (s > q) & (q > 0)
    del s_act

    # The kernel only touches gated tokens (at most a (1 - alpha) share): gather them, contract, scatter.
    idx = gate.nonzero(as_tuple=True)
    s_g, d_g = s[idx], d[idx]
    rel = (q / s_g) if invert else (s_g / q)  # > 1 on gated tokens
    psi = 1.0 / (1.0 + rel.pow(exponent))
    c_plus = torch.where(d_g > 0, psi, torch.ones_like(psi))
    c_minus = torch.where(d_g < 0, psi, torch.ones_like(psi))

    lo = torch.full_like(d, 1.0 - eps_low)
    hi = torch.full_like(d, 1.0 + eps_high)
    lo[idx] = 1.0 - eps_low * c_minus
    hi[idx] = 1.0 + eps_high * c_plus

    # Table 10 diagnostics from the gated subset: ungated active tokens contribute the base radii.
    n_t = count(mask)
    n_act = mask.sum().to(torch.float32)
    eps_low_mean = (eps_low * (n_act - psi.numel()) + eps_low * c_minus.sum(dtype=torch.float32)) / n_t
    eps_high_mean = (eps_high * (n_act - psi.numel()) + eps_high * c_plus.sum(dtype=torch.float32)) / n_t
    c_min = torch.minimum(c_plus.min(), c_minus.min()) if psi.numel() else d.new_ones(())
    metrics = {
        "q": q.to(torch.float32),
        "gate_rate": gate.sum().to(torch.float32) / n_t,
        "eps_low_mean": eps_low_mean,
        "eps_high_mean": eps_high_mean,
        "c_min": c_min.to(torch.float32),
        "tok/gate": gate,
    }
    return lo, hi, metrics
