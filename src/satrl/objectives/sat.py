"""SAT: the Staleness-Adaptive Trust Region's clip bounds (paper Section 4.2, Eqs. 13-17, Table 10).

    d = sg[log r]                                   # [B, T], the detached log-ratio (Eq. 13)
    s = |d|  (or a proxy score)                      # what the gate ranks
    q = the ceil(alpha*n)-th smallest s over the n active tokens   (Eq. 14, inverse-CDF order statistic)
    gate = q > 0 and s > q                           # strict: at most n - ceil(alpha*n) tokens
    c+ = psi(s; q) on gated tokens with d > 0, else 1   psi(u; q) = 1 / (1 + (u/q)^p)   (Eqs. 15-16)
    c- = psi(s; q) on gated tokens with d < 0, else 1
    lo = 1 - eps_low * c-,   hi = 1 + eps_high * c+  (Eq. 17; detached)

With s = |d| this is exactly the paper: u+ = [d]+ equals |d| when d > 0 and psi(0; q) = 1 otherwise.

Where it lives: this file holds SAT's training path, top to bottom: the gate and kernel (:func:`sat_gate`;
its order statistic :func:`kth_smallest` is in ``selection.py``), the bounds and Table 10 metrics, the dense
reference :func:`sat_clip_bounds` (bounds for every token, for ``clipped_surrogate``), and the registered
trust region :func:`sat_trust_region` the trainer runs (PPO plus a sparse fix-up on gated tokens, equal
value for value to the dense reference; tested). ``presets.ObjectiveSpec`` calls it like any trust region.
On CPU float32 tensors the trust region runs the paper's gate and the fix-up as compiled loops
(``native.py``) when it can, with the same results bit for bit.

Options beyond the paper (all off by default):
- ``score``: a proxy [B, T] replacing |d| (e.g. |pi - mu| or the lag). The gate ranks the score against
  the score's own quantile, psi is evaluated on score/q, and the side is still chosen by sign(d).
- ``invert``: the falsification control. It gates the *bottom* tail instead: with m = n - ceil(alpha*n)
  (the most tokens the normal gate can pick), q_lo is the (m+1)-th smallest score and gate = s < q_lo,
  so at most m tokens are gated (fewer with ties), the same budget as the normal gate. The kernel
  mirrors the normal one: psi is evaluated on q_lo/s (> 1 on gated tokens, infinite at s = 0), so gated
  tokens get c in (0, 1/2) in both modes and the *least* stale tokens are contracted the most.
  Tokens with d == 0 have no outward side and keep c = 1 in both modes.
- ``shuffle``: the selection control. The normal gate and kernel are computed, then the same number of
  gated slots, with the same multiset of kernel values psi, is moved to active tokens drawn at random
  (a hash of position and d, so the function stays pure and device-side). It asks whether *which* tokens
  SAT contracts matters, holding how many and how much fixed. (The inverted gate cannot: a bottom-tail
  token is past its contracted radius only if |d| < q_lo^2 / eps, so it never binds.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from satrl.tensors import as_bool_mask, flat_nonzero, masked

from . import native
from .registry import component_registry, positive, unit_interval
from .selection import MARGIN, RADIX_MIN, SAMPLE, _kth_and_above, bracket_value, kth_smallest, quantile_rank  # noqa: F401
from .trust_regions import _EPS, _EPS_CHECKS, TRUST_REGIONS, ObjectiveInputs, _clip


@dataclass(frozen=True)
class SatGate:
    """The sparse result of SAT's gate: which tokens contract, and by how much.

    ``idx`` holds the flat positions of the G gated tokens, ``d`` their log-ratio (its sign picks the
    side) and ``psi`` their kernel value: c+ = psi where d > 0, c- = psi where d < 0; every other
    (token, side) keeps c = 1.
    """

    q: Tensor  # 0-dim threshold
    gate: Tensor  # [B, T] bool
    idx: Tensor  # [G] flat positions
    d: Tensor  # [G]
    psi: Tensor  # [G]
    n: int  # active tokens


@torch.no_grad()
def sat_gate(
    d: Tensor,
    mask: Tensor,
    alpha: float = 0.9,
    exponent: float = 2.0,
    invert: bool = False,
    score: Tensor | None = None,
    shuffle: bool = False,
    zero_masked: bool = False,
    n: int | None = None,
    abs_d: Tensor | None = None,
) -> SatGate:
    """Quantile, gate and kernel of SAT (Eqs. 14-16), the kernel evaluated on gated tokens only.

    ``zero_masked=True`` is the caller's promise that the score (``|d|`` or ``score``) is an ``abs``
    output (>= 0, no sign bit) and exactly 0 on masked positions (true of the ratio levels' ``d`` and
    of the ``prob_diff`` proxy); the quantile then needs no +inf
    fill and the gate no mask. The result is the same either way (tested). ``n``: the number of active tokens,
    if the caller has counted them; ``abs_d``: ``|d|``, if the caller has it (used when ``score`` is None)."""
    if invert and shuffle:
        raise ValueError("SAT: invert and shuffle are two different controls; set at most one")
    mask = as_bool_mask(mask)
    d = d.detach()
    if score is None:
        s = d.abs() if abs_d is None else abs_d.detach()
    else:
        s = score.detach().to(d.dtype)
    n = int(torch.count_nonzero(mask)) if n is None else n
    k = quantile_rank(alpha, n)
    if zero_masked:
        # Scores are >= 0 and exactly 0 on the numel - n masked positions, which therefore sort first:
        # the j-th smallest active score is the (j + numel - n)-th smallest of the whole tensor.
        ranked, offset = s, s.numel() - n
    else:
        # Masked positions become +inf, so the k-th smallest of the whole tensor is the k-th active one.
        ranked, offset = torch.where(mask, s, float("inf")), 0
    nonneg = zero_masked or score is None  # |d| (or a promised non-negative score)
    idx = d_g = None
    if invert:
        m = n - k  # gate budget, identical to the normal mode's
        q = kth_smallest(ranked, m + 1 + offset, nonneg=nonneg) if m > 0 else s.new_zeros(())
        gate = (s < q) & mask
    elif k < 1:
        q, gate = s.new_zeros(()), torch.zeros_like(mask)
    elif zero_masked and s.dtype == torch.float32 and s.numel() >= RADIX_MIN:
        # one pass for q, one for the gated positions (and d there, when s is |d|)
        q, idx, d_g = _kth_and_above(s, k + offset, d if score is None else None)
        gate = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
        gate.view(-1).index_fill_(0, idx, True)
    else:
        q = kth_smallest(ranked, k + offset, nonneg=nonneg)
        if not bool(q > 0):
            gate = torch.zeros_like(mask)
        else:  # masked scores are 0 < q under zero_masked: no mask needed
            gate = (s > q) if zero_masked else (s > q) & mask
    del ranked
    if idx is None:
        idx = flat_nonzero(gate)  # at most a (1 - alpha) share of the tokens
    if d_g is None:
        d_g = d.reshape(-1).index_select(0, idx)
    s_g = d_g.abs() if score is None else s.reshape(-1).index_select(0, idx)  # |d| at idx: no second gather
    rel = (q / s_g) if invert else (s_g / q)  # > 1 on gated tokens
    psi = rel.pow_(exponent).add_(1.0).reciprocal_()  # 1 / (1 + rel^p), in place: one buffer, not four
    if shuffle:
        idx, gate = _random_slots(d, mask, idx.numel())
        d_g = d.reshape(-1).index_select(0, idx)
    return SatGate(q=q, gate=gate, idx=idx, d=d_g, psi=psi, n=n)


def _adv_index(idx: Tensor, adv: Tensor, cols: int) -> Tensor:
    """Flat positions of ``idx`` in ``adv``: the row for a [B, 1] advantage (no [B, T] copy of it), else
    ``idx``. A shift when ``cols`` is a power of two: int64 division is not vectorized on CPU."""
    if adv.shape[-1] != 1:
        return idx
    return idx >> (cols.bit_length() - 1) if cols & (cols - 1) == 0 else idx // cols


def _random_slots(d: Tensor, mask: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """``count`` active positions chosen pseudo-randomly (sorted), and their [B, T] gate: the ranks of a
    sine hash of (position, d), so the choice is a pure function of the inputs and changes with them."""
    active = flat_nonzero(mask)
    pos = active.to(torch.float64)
    val = d.reshape(-1).index_select(0, active).to(torch.float64)
    key = torch.frac(torch.sin(pos * 12.9898 + val * 7823.3 + 0.5) * 43758.5453).abs()
    idx = active.index_select(0, torch.topk(key, count).indices).sort().values
    gate = torch.zeros_like(mask).reshape(-1).index_fill_(0, idx, True).reshape(mask.shape)
    return idx, gate


def gated_bounds(g: SatGate, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """(lo, hi) of the gated tokens: the sign-selected endpoint contracted, the other exactly the base."""
    hi = torch.where(g.d > 0, 1.0 + eps_high * g.psi, 1.0 + eps_high)
    lo = torch.where(g.d < 0, 1.0 - eps_low * g.psi, 1.0 - eps_low)
    return lo.to(g.d.dtype), hi.to(g.d.dtype)


def sat_metrics(g: SatGate, eps_low: float, eps_high: float) -> dict[str, Tensor]:
    """Paper Table 10 over active tokens: q, gate rate, mean effective radii, strongest contraction."""
    psi = g.psi.to(torch.float32)
    # sums over the d > 0 and d < 0 tokens through products with 0/1 floats (sign(d) clamped), not `where`
    # (unvectorized on CPU); the summed tensors, hence the sums, are the same bit for bit
    sign = torch.sign(g.d.to(torch.float32)).nan_to_num_(0.0)  # NaN d: no side
    pos = sign.clamp(min=0.0)
    deficit = 1.0 - psi
    c = torch.maximum(psi, 1.0 - sign.abs())  # psi where d != 0, else 1 (no outward side)
    c_min = c.min().clamp(max=1.0) if c.numel() else torch.ones((), device=g.q.device)
    # pos - sign: 1 where d < 0, else 0
    return _table10(g, deficit * pos, deficit * (pos - sign), c_min, eps_low, eps_high)


def _table10(g: SatGate, deficit_pos: Tensor, deficit_neg: Tensor, c_min: Tensor, eps_low: float,
             eps_high: float) -> dict[str, Tensor]:
    """:func:`sat_metrics` from the gated tokens' 1 - c+ and 1 - c- terms ([G] each) and the smallest c."""
    n_t = torch.tensor(float(max(g.n, 1)), device=g.q.device)
    return {
        "q": g.q.to(torch.float32),
        "gate_rate": torch.tensor(float(g.idx.numel()), device=g.q.device) / n_t,
        "eps_low_mean": eps_low - eps_low * deficit_neg.sum() / n_t,
        "eps_high_mean": eps_high - eps_high * deficit_pos.sum() / n_t,
        "c_min": c_min,
        "tok/gate": g.gate,
    }


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
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """SAT's adaptive clip interval [lo, hi] per token (detached).

    Args:
        d: [B, T] log-ratio log r (treated as detached; masked positions may hold garbage).
        mask: [B, T] active tokens.
        score: optional [B, T] non-negative proxy replacing |d| for the gate and the kernel.
    Returns:
        lo, hi: [B, T] bounds (exactly the base radii on masked and ungated positions);
        metrics: ``q``, ``gate_rate``, ``eps_low_mean``, ``eps_high_mean``, ``c_min`` (paper Table 10,
        0-dim) and ``tok/gate`` ([B, T] bool).
    """
    g = sat_gate(d, mask, alpha, exponent, invert, score, shuffle)
    lo_g, hi_g = gated_bounds(g, eps_low, eps_high)
    # torch.full, not full_like: row-major whatever d's layout, so flat positions are g.idx's
    hi = torch.full(d.shape, 1.0 + eps_high, dtype=d.dtype, device=d.device)
    lo = torch.full(d.shape, 1.0 - eps_low, dtype=d.dtype, device=d.device)
    hi.view(-1).index_copy_(0, g.idx, hi_g)
    lo.view(-1).index_copy_(0, g.idx, lo_g)
    return lo, hi, sat_metrics(g, eps_low, eps_high)


# ---------------------------------------------------------------------------------------- the training path
# SAT's gate score ("proxy"): what the gate ranks instead of |d|. Each is ``fn(inp) -> [B, T] | None`` (None:
# |d| itself), declares ``zero_masked`` (its values are abs() values, exactly 0 on masked positions), ``abs_d``
# (it is |d| itself, the paper's score, which the compiled loops implement) and what
# it needs beyond the log-probs (``lag``: integrations that pass no per-token lags offer only the others).
SAT_PROXIES = component_registry("SAT proxy")


@SAT_PROXIES.register("log_ratio", traits={"zero_masked": True, "abs_d": True})
def _log_ratio_score(inp: ObjectiveInputs) -> Tensor | None:
    """|d| (the paper): None, so sat_gate ranks |d| (``inp.abs_d`` when the caller computed it)."""
    return None


@SAT_PROXIES.register("prob_diff", traits={"zero_masked": True, "abs_d": False})
def _prob_diff_score(inp: ObjectiveInputs) -> Tensor:
    """|pi - mu| of the sampled token."""
    return masked((inp.logp.detach().exp() - inp.denom_logp.exp()).abs(), inp.mask)


@SAT_PROXIES.register("version_age", needs=("lag",), traits={"zero_masked": False, "abs_d": False})
def _version_age_score(inp: ObjectiveInputs) -> Tensor:
    """The token's lag (trainer version - sample version)."""
    if inp.lag is None:
        raise ValueError("SAT proxy='version_age' needs lag= (the per-token lag); pass it or use "
                         "proxy='log_ratio'")
    return masked(inp.lag.to(inp.logp.dtype), inp.mask)


PROXIES = tuple(SAT_PROXIES.names())
ZERO_MASKED = tuple(name for name, c in SAT_PROXIES.items() if c.traits["zero_masked"])
LAG_FREE_PROXIES = tuple(name for name, c in SAT_PROXIES.items() if "lag" not in c.needs)  # no lag= needed


@torch.no_grad()
def sat_score(proxy: str, inp: ObjectiveInputs) -> Tensor | None:
    """The gate's score under ``proxy`` (one of :data:`SAT_PROXIES`): None (= |d|, the paper), |pi - mu| of the
    sampled token, or the token's lag."""
    return SAT_PROXIES.get(proxy).fn(inp)


def gate_from_inputs(d: Tensor, mask: Tensor, inp: ObjectiveInputs, alpha: float, exponent: float, invert: bool, proxy: str,
                     shuffle: bool) -> SatGate:
    """:func:`sat_gate` as the trust regions call it: the proxy's score, and the active count and ``|d|`` the
    objective has already computed (``inp.n_active``, ``inp.abs_d``)."""
    n = None if inp.n_active is None else int(inp.n_active)
    return sat_gate(d, mask, alpha, exponent, invert, score=sat_score(proxy, inp), shuffle=shuffle,
                    zero_masked=proxy in ZERO_MASKED, n=n, abs_d=inp.abs_d)


@TRUST_REGIONS.register(
    "sat",
    defaults={**_EPS, "alpha": 0.9, "exponent": 2.0, "proxy": "log_ratio", "invert": False, "shuffle": False},
    choices={"proxy": PROXIES, "invert": (False, True), "shuffle": (False, True)},
    checks={**_EPS_CHECKS, "alpha": (unit_interval, "in [0, 1]"), "exponent": (positive, "> 0")},
)
def sat_trust_region(ratio, d, adv, mask, inp, *, eps_low, eps_high, dual_clip, alpha, exponent, proxy, invert, shuffle):
    """SAT: PPO clip with per-token bounds from :func:`sat_clip_bounds` (paper Eqs. 13-19).

    ``d`` is the ratio level's own log-ratio: the token log-ratio for GRPO, the broadcast sequence
    log-ratio for GSPO (paper Eq. 20), so the gate ranks sequences, length-weighted, under GSPO.

    Computed as PPO plus a sparse fix-up (Proposition 4.1 (iii)): the loss equals PPO's except on gated
    tokens pushed past their contracted endpoint (A > 0, r > 1 + eps_high*c+; A < 0, r < 1 - eps_low*c-),
    where it is the constant -bound*A with zero gradient. This is value-for-value what
    ``clipped_surrogate(ratio, adv, lo, hi)`` gives with the dense bounds (tested), at the cost of the
    gated tokens only.
    """
    paper_gate = SAT_PROXIES.get(proxy).traits["abs_d"] and not invert and not shuffle and exponent == 2.0
    fast = _native_fixup(ratio, d, adv, inp, alpha, eps_low, eps_high) if paper_gate else None
    if fast is not None:
        g, pos, value, new_high, new_low, sat_m = fast
    else:
        g = gate_from_inputs(d, mask, inp, alpha, exponent, invert, proxy, shuffle)
        pos, value, new_high, new_low = _fixup(g, ratio, adv, eps_low, eps_high)
        sat_m = sat_metrics(g, eps_low, eps_high)
    # PPO with a sparse override: the loss is the constant -bound*A (zero gradient) on the hit tokens
    loss, clipped, metrics = _clip(ratio, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip, (pos, value), inp.n)
    metrics.update(sat_m)
    metrics["clipfrac_high"] += new_high
    metrics["clipfrac_low"] += new_low
    # The only tokens whose gradient SAT changes (Prop. 4.1 (iii)): if this is 0, SAT == PPO this step.
    metrics["sat_clipfrac"] = new_high + new_low
    return loss, clipped, metrics


@torch.no_grad()
def _fixup(g: SatGate, ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float):
    """The gated tokens pushed past their contracted endpoint: (flat positions, the constant loss -bound*A
    there, and the shares of active tokens that are such hits inside PPO's own interval, upper and lower)."""
    r_g = ratio.detach().reshape(-1).index_select(0, g.idx)
    a_g = adv.reshape(-1).index_select(0, _adv_index(g.idx, adv, ratio.shape[-1]))
    # Only the contracted endpoint can be crossed: r = e^d, so r > 1 + eps_high*psi needs d > 0 (where
    # c+ = psi) and r < 1 - eps_low*psi needs d < 0 (where c- = psi); the other endpoint is PPO's own.
    # So the test needs no sign of d, and no `where` (which, unlike arithmetic, is not vectorized on CPU).
    hi, lo = 1.0 + eps_high * g.psi, 1.0 - eps_low * g.psi
    hit = flat_nonzero(((a_g > 0) & (r_g > hi)) | ((a_g < 0) & (r_g < lo)))
    a_h, r_h = a_g.index_select(0, hit), r_g.index_select(0, hit)
    up = a_h > 0
    value = torch.where(up, hi.index_select(0, hit), lo.index_select(0, hit)) * -a_h
    n_t = torch.tensor(float(max(g.n, 1)), device=ratio.device)
    # tokens newly clipped by SAT: past the contracted endpoint but inside PPO's interval
    new_high = torch.count_nonzero(up & ~(r_h > 1.0 + eps_high)) / n_t
    new_low = torch.count_nonzero(~up & ~(r_h < 1.0 - eps_low)) / n_t
    return g.idx.index_select(0, hit), value, new_high, new_low


@torch.no_grad()
def _native_fixup(ratio: Tensor, d: Tensor, adv: Tensor, inp: ObjectiveInputs, alpha: float, eps_low: float,
                  eps_high: float):
    """The paper's gate and :func:`_fixup` through the compiled loops (``native.py``): the same gate, hits,
    values and metrics, bit for bit; None where they do not apply (then the torch path runs).

    The same steps as the torch path: a strided sample brackets q (``selection._kth_and_above``); the first
    loop keeps the candidates at or above the bracket with d, r and A there; q is their exact order
    statistic (the full selection if the bracket missed); the second loop does gate, kernel, fix-up and
    the Table 10 terms."""
    N = d.numel()
    if N < RADIX_MIN or not native.usable(d, ratio, adv):
        return None
    n = int(torch.count_nonzero(inp.mask)) if inp.n_active is None else int(inp.n_active)
    k = quantile_rank(alpha, n)
    if k < 1:
        return None
    k += N - n  # masked |d| is exactly 0 (zero_masked) and sorts first
    r = ratio.detach()
    j = int((k / N - MARGIN) * min(N, SAMPLE))
    cand = None
    if j >= 1:
        # |d| of the sample only, when the caller has not computed |d| (GSPO): the same values
        v = bracket_value(d.reshape(-1), j, absolute=True) if inp.abs_d is None else bracket_value(inp.abs_d.reshape(-1), j)
        cand = native.candidates(d, r, adv, int(v.view(torch.int32)), N - (j * N) // min(N, SAMPLE) + N // 50)
        below = N - cand[0].numel()
        q = kth_smallest(cand[1].abs(), k - below, nonneg=True) if below < k else None
    if cand is None or q is None:  # no bracket, or it missed: exact selection over all, then s >= q
        q = kth_smallest(d.abs().reshape(-1) if inp.abs_d is None else inp.abs_d.reshape(-1), k, nonneg=True)
        cand = native.candidates(d, r, adv, int(q.view(torch.int32)), N - k + 16)
    if not bool(q > 0):
        cand = tuple(t[:0] for t in cand)  # no gate
    out = native.gate_fixup(*cand, q, eps_low, eps_high, d.shape)
    g = SatGate(q=q, gate=out["gate"], idx=out["idx"], d=out["d"], psi=out["psi"], n=n)
    n_t = torch.tensor(float(max(n, 1)))
    c_min = out["c_min"].clamp(max=1.0) if out["idx"].numel() else torch.ones(())
    sat_m = _table10(g, out["def_pos"], out["def_neg"], c_min, eps_low, eps_high)
    new_high = torch.tensor(out["new_high"]) / n_t
    new_low = torch.tensor(out["new_low"]) / n_t
    return g, out["hit"], out["value"], new_high, new_low, sat_m
