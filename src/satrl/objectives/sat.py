"""SAT: the Staleness-Adaptive Trust Region's clip bounds (paper Section 4.2, Eqs. 13-19, Table 10).

    d = sg[log r]                                   # [B, T], the detached log-ratio (Eq. 13)
    s = |d|  (or a proxy score)                      # what the gate ranks
    q = the ceil(alpha*n)-th smallest s over the n active tokens   (Eq. 14, inverse-CDF order statistic)
    gate = q > 0 and s > q                           # strict: at most n - ceil(alpha*n) tokens
    c+ = psi(s; q) on gated tokens with d > 0, else 1   psi(u; q) = 1 / (1 + (u/q)^p)   (Eqs. 15-16)
    c- = psi(s; q) on gated tokens with d < 0, else 1
    lo = 1 - eps_low * c-,   hi = 1 + eps_high * c+  (Eq. 17; detached)
    loss = -min(r A, clip(r, lo, hi) A)              (Eqs. 18-19)

With s = |d| this is exactly the paper: u+ = [d]+ equals |d| when d > 0 and psi(0; q) = 1 otherwise.
One implementation: :func:`sat_gate` (quantile, gate, kernel; dense, no host sync: the order statistic is a
sort indexed by a device-side rank), :func:`sat_clip_bounds` (the bounds) and the registered trust region
:func:`sat_trust_region` (the bounds, then PPO's clipped surrogate).

Options beyond the paper (all off by default):
- ``proxy``: what the gate ranks instead of |d| (:data:`SAT_PROXIES`: |pi - mu| or the lag). The gate ranks
  the score against the score's own quantile, psi is evaluated on score/q, the side is still sign(d).
- ``invert``: the falsification control. It gates the *bottom* tail instead: with m = n - ceil(alpha*n)
  (the most tokens the normal gate can pick), q_lo is the (m+1)-th smallest score and gate = s < q_lo,
  so at most m tokens are gated (fewer with ties), the same budget as the normal gate. psi is evaluated
  on q_lo/s (> 1 on gated tokens), so gated tokens get c in (0, 1/2) in both modes and the *least* stale
  tokens are contracted the most. Tokens with d == 0 have no outward side and keep c = 1 in both modes.
- ``shuffle``: the selection control. The normal gate and kernel are computed, then the same number of
  gated slots, with the same multiset of kernel values psi, is moved to active tokens drawn at random
  (a hash of position and d, so the function stays pure). It asks whether *which* tokens SAT contracts
  matters, holding how many and how much fixed. (It counts the gated tokens on the host: a control, not a
  training path.)
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import Tensor

from satrl.tensors import as_bool_mask, flat_nonzero, masked_frac

from .params import SAT_PROXIES
from .trust_regions import ObjectiveInputs, Region, clip_flags, clipped_surrogate

# ----------------------------------------------------------------------------------------- the order statistic


def quantile_rank(alpha: float, n: int) -> int:
    """k = ceil(alpha * n), computed exactly (0.7 * 10 is 7, not 7.000000000000001)."""
    frac = Fraction(repr(float(alpha)))
    return -((-frac.numerator * n) // frac.denominator)


def _rank(alpha: float, n: Tensor) -> Tensor:
    """:func:`quantile_rank` of a 0-dim integer tensor, on its device (no host sync)."""
    frac = Fraction(repr(float(alpha)))
    return -torch.div(-frac.numerator * n, frac.denominator, rounding_mode="floor")


def kth_smallest(values: Tensor, k: int | Tensor, most: int | None = None) -> Tensor:
    """The k-th smallest entry (1-based; NaN sorts last) of a tensor, as a 0-dim tensor; 0 when k < 1.

    An exact order statistic (Eq. 14's inverse-CDF convention), never ``torch.quantile``, which
    interpolates. ``k`` may be a device tensor: the value is read by a device-side index, so there is no
    host sync. ``most``: a bound, known on the host, on every k that can occur; then only the ``most``
    smallest entries are selected (``torch.topk``, far cheaper than a full sort when ``most`` is small)."""
    return _order_statistic(values, k, most, largest=False)


def kth_largest(values: Tensor, k: int | Tensor, most: int | None = None) -> Tensor:
    """The k-th largest entry (NaN counts as largest), as :func:`kth_smallest` counts from the other end."""
    return _order_statistic(values, k, most, largest=True)


def _order_statistic(values: Tensor, k: int | Tensor, most: int | None, largest: bool) -> Tensor:
    flat = values.detach().reshape(-1)
    if flat.numel() == 0:
        return flat.new_zeros(())
    m = flat.numel() if most is None else max(1, min(most, flat.numel()))
    ranked = flat.topk(m, largest=largest).values  # sorted, the k-th at k - 1
    k = torch.as_tensor(k, device=flat.device).reshape(1)
    kth = ranked.index_select(0, (k - 1).clamp(0, m - 1))[0]  # a gather: no sync
    return torch.where(k[0] >= 1, kth, torch.zeros_like(kth))


def gate_budget(alpha: float, numel: int) -> int:
    """numel - ceil(alpha * numel) + 1: a host-side bound on the rank, counted from the far end, of SAT's
    quantile in a call of at most ``numel`` active tokens (n - ceil(alpha n) never decreases with n)."""
    return numel - quantile_rank(alpha, numel) + 1


# -------------------------------------------------------------------------------------------------- the gate
@dataclass(frozen=True)
class SatGate:
    """SAT's gate over a [B, T] call: which tokens contract, and by how much.

    ``psi`` is the kernel value on gated tokens and 1 elsewhere; c+ = psi where d > 0, c- = psi where
    d < 0, every other (token, side) keeps c = 1."""

    q: Tensor  # 0-dim threshold
    gate: Tensor  # [B, T] bool
    psi: Tensor  # [B, T]
    d: Tensor  # [B, T] detached log-ratio (its sign picks the side)
    n: Tensor  # 0-dim float32 active-token count, at least 1

    def bounds(self, center: float, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
        """(lo, hi) [B, T]: [center - eps_low c-, center + eps_high c+]; center 1 for ratios, 0 for log-ratios."""
        up, down = self.gate & (self.d > 0), self.gate & (self.d < 0)
        hi = torch.where(up, center + eps_high * self.psi, center + eps_high).to(self.d.dtype)
        lo = torch.where(down, center - eps_low * self.psi, center - eps_low).to(self.d.dtype)
        return lo, hi

    def metrics(self, eps_low: float, eps_high: float) -> dict[str, Tensor]:
        """Paper Table 10 over active tokens: q, gate rate, mean effective radii, strongest contraction."""
        deficit = 1.0 - self.psi.to(torch.float32)  # 0 off the gate
        d = self.d.to(torch.float32)
        sided = self.gate & (d != 0)  # a token with d == 0 (or NaN) has no outward side: c = 1
        c_min = torch.where(sided, self.psi.to(torch.float32), 1.0).min() if d.numel() else torch.ones(())
        return {
            "q": self.q.to(torch.float32),
            "gate_rate": torch.count_nonzero(self.gate) / self.n,
            "eps_low_mean": eps_low - eps_low * torch.where(d < 0, deficit, 0.0).sum() / self.n,
            "eps_high_mean": eps_high - eps_high * torch.where(d > 0, deficit, 0.0).sum() / self.n,
            "c_min": c_min.clamp(max=1.0),
        }


@torch.no_grad()
def sat_gate(
    d: Tensor,
    mask: Tensor,
    alpha: float = 0.9,
    exponent: float = 2.0,
    invert: bool = False,
    score: Tensor | None = None,
    shuffle: bool = False,
) -> SatGate:
    """Quantile, gate and kernel of SAT (Eqs. 14-16) for a [B, T] log-ratio ``d`` (masked positions may hold
    garbage) and a [B, T] ``mask``; ``score``: an optional non-negative [B, T] proxy replacing |d|."""
    if invert and shuffle:
        raise ValueError("SAT: invert and shuffle are two different controls; set at most one")
    mask, d = as_bool_mask(mask), d.detach()
    s = d.abs() if score is None else score.detach().to(d.dtype)
    n = torch.count_nonzero(mask)
    k = _rank(alpha, n)
    most = gate_budget(alpha, s.numel())  # both ranks below count from the near end: at most this
    if invert:
        m = n - k  # the gate's budget, as in the normal mode: q_lo is the (m+1)-th smallest active score
        q = kth_smallest(torch.where(mask, s, float("inf")), m + 1, most)
        q = torch.where(m > 0, q, 0.0).to(s.dtype)
        gate = (s < q) & mask
        rel = q / s
    else:  # the k-th smallest active score is the (n - k + 1)-th largest once masked scores sort first
        q = torch.where(k >= 1, kth_largest(torch.where(mask, s, float("-inf")), n - k + 1, most), 0.0).to(s.dtype)
        gate = (s > q) & mask & (q > 0)
        rel = s / q  # > 1 on gated tokens
    psi = torch.where(gate, rel.pow(exponent).add(1.0).reciprocal(), 1.0).to(d.dtype)
    if shuffle:
        gate, psi = _shuffled(d, mask, gate, psi)
    return SatGate(q=q, gate=gate, psi=psi, d=d, n=n.clamp(min=1).to(torch.float32))


def _shuffled(d: Tensor, mask: Tensor, gate: Tensor, psi: Tensor) -> tuple[Tensor, Tensor]:
    """The gate's slots moved to as many active positions drawn pseudo-randomly (the ranks of a sine hash of
    (position, d): a pure function of the inputs), the kernel values kept in position order."""
    idx = flat_nonzero(gate)
    active = flat_nonzero(mask)
    pos = active.to(torch.float64)
    val = d.reshape(-1).index_select(0, active).to(torch.float64)
    key = torch.frac(torch.sin(pos * 12.9898 + val * 7823.3 + 0.5) * 43758.5453).abs()
    new = active.index_select(0, torch.topk(key, idx.numel()).indices).sort().values
    moved = torch.ones_like(psi).reshape(-1).index_copy_(0, new, psi.reshape(-1).index_select(0, idx))
    slots = torch.zeros_like(gate).reshape(-1).index_fill_(0, new, True)
    return slots.reshape(gate.shape), moved.reshape(psi.shape)


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
    shuffle: bool = False,
) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor]:
    """SAT's adaptive clip interval [lo, hi] per token (detached).

    Args:
        d: [B, T] log-ratio log r (treated as detached; masked positions may hold garbage).
        mask: [B, T] active tokens.
        score: optional [B, T] non-negative proxy replacing |d| for the gate and the kernel.
    Returns:
        lo, hi: [B, T] bounds (exactly the base radii on masked and ungated positions);
        metrics: ``q``, ``gate_rate``, ``eps_low_mean``, ``eps_high_mean``, ``c_min`` (paper Table 10, 0-dim);
        gate: [B, T] bool.
    """
    g = sat_gate(d, mask, alpha, exponent, invert, score, shuffle)
    lo, hi = g.bounds(1.0, eps_low, eps_high)
    return lo, hi, g.metrics(eps_low, eps_high), g.gate


# ------------------------------------------------------------------------------------------ the gate's score
# The scores themselves are :mod:`satrl.objectives.proxies`; their registry, which the gate's ``proxy`` field
# names, :data:`satrl.objectives.params.SAT_PROXIES`.
PROXIES = tuple(SAT_PROXIES.names())
LAG_FREE_PROXIES = tuple(name for name, c in SAT_PROXIES.items() if "lag" not in c.needs)  # no lag= needed


@torch.no_grad()
def sat_score(proxy: str, inp: ObjectiveInputs) -> Tensor | None:
    """The gate's score under ``proxy`` (one of :data:`SAT_PROXIES`): None (= |d|, the paper), |pi - mu| of the
    sampled token, or the token's lag."""
    return SAT_PROXIES.get(proxy).fn(inp)


def gate_of(d: Tensor, mask: Tensor, inp: ObjectiveInputs, p: dict) -> SatGate:
    """:func:`sat_gate` as the trust regions call it, with the proxy's score; ``p`` holds the
    :class:`~satrl.objectives.params.GateParams` values (and may hold others)."""
    return sat_gate(d, mask, p["alpha"], p["exponent"], p["invert"], sat_score(p["proxy"], inp), p["shuffle"])


def sat_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, dual_clip, **gate) -> Region:
    """SAT: PPO clip with per-token bounds from the gate (paper Eqs. 13-19).

    ``d`` is the ratio level's own log-ratio: the token log-ratio for GRPO, the broadcast sequence
    log-ratio for GSPO (paper Eq. 20), so the gate ranks sequences, length-weighted, under GSPO.
    """
    g = gate_of(d, mask, inp, gate)
    lo, hi = g.bounds(1.0, eps_low, eps_high)
    loss = clipped_surrogate(ratio, adv, lo, hi, dual_clip)
    clipped, metrics = clip_flags(ratio, adv, mask, lo, hi, dual_clip, inp.n)
    metrics.update(g.metrics(eps_low, eps_high))
    # The only tokens whose gradient SAT changes (Prop. 4.1 (iii)): if this is 0, SAT == PPO this step.
    base, _ = clip_flags(ratio, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip, inp.n)
    metrics["sat_clipfrac"] = masked_frac(clipped & ~base, mask, inp.n)
    return Region(loss, clipped, metrics, g.gate)
