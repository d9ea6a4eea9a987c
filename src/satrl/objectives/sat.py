"""SAT: the Staleness-Adaptive Trust Region's clip bounds (paper Section 4.2, Eqs. 13-17, Table 10).

    d = sg[log r]                                   # [B, T], the detached log-ratio (Eq. 13)
    s = |d|  (or a proxy score)                      # what the gate ranks
    q = the ceil(alpha*n)-th smallest s over the n active tokens   (Eq. 14, inverse-CDF order statistic)
    gate = q > 0 and s > q                           # strict: at most n - ceil(alpha*n) tokens
    c+ = psi(s; q) on gated tokens with d > 0, else 1   psi(u; q) = 1 / (1 + (u/q)^p)   (Eqs. 15-16)
    c- = psi(s; q) on gated tokens with d < 0, else 1
    lo = 1 - eps_low * c-,   hi = 1 + eps_high * c+  (Eq. 17; detached)

With s = |d| this is exactly the paper: u+ = [d]+ equals |d| when d > 0 and psi(0; q) = 1 otherwise.

Where it lives: this file holds SAT's whole training path, top to bottom: the order statistic
(:func:`kth_smallest`), the gate and kernel (:func:`sat_gate`), the bounds and Table 10 metrics, the dense
reference :func:`sat_clip_bounds` (bounds for every token, for ``clipped_surrogate``), and the registered
trust region :func:`sat_trust_region` the trainer runs (PPO plus a sparse fix-up on gated tokens, equal
value for value to the dense reference; tested). ``presets.ObjectiveSpec`` calls it like any trust region.

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

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from satrl.tensors import as_bool_mask, flat_nonzero, masked

from .registry import component_registry, positive, unit_interval
from .trust_regions import _EPS, _EPS_CHECKS, TRUST_REGIONS, ObjectiveInputs, _clip


def quantile_rank(alpha: float, n: int) -> int:
    """k = ceil(alpha * n), computed exactly (0.7 * 10 is 7, not 7.000000000000001)."""
    return math.ceil(Fraction(repr(float(alpha))) * n)


RADIX_MIN = 1 << 16  # below this many values, kthvalue is as fast and simpler


def kth_smallest(values: Tensor, k: int, method: str = "auto", nonneg: bool = False) -> Tensor:
    """The k-th smallest entry (1-based) of a flat tensor, as a 0-dim tensor; 0 when k < 1.

    An exact order statistic, never ``torch.quantile`` (which interpolates, so it is not Eq. 14's
    inverse-CDF convention, and refuses inputs above 16M elements). ``method``:
    - ``numpy``: numpy's introselect (``np.partition``) on a CPU copy, NaN last as in kthvalue; float16 and
      bfloat16 go through float32, which holds them exactly. Several times faster than the radix select on
      CPU (``python -m benchmarks.objectives`` prints both), and one copy of the input in memory.
    - ``radix``: float16/bfloat16/float32 only; two 16-bit histogram passes, no sort; the device-side choice.
    - ``kthvalue``: torch's own.
    - ``auto``: numpy for CPU inputs of at least ``RADIX_MIN`` entries, radix for larger float inputs on other
      devices, kthvalue otherwise.
    All return the same value (tested). ``nonneg=True`` promises no negative entries and no sign bit set,
    -0.0 included: true of ``abs`` outputs, NaN and +inf allowed), which saves the radix select a pass and
    a host sync.
    """
    n = values.numel()
    if k < 1 or n == 0:
        return values.new_zeros(())
    k = min(k, n)
    radix_ok = values.dtype in (torch.float32, torch.bfloat16, torch.float16)
    if method == "auto":
        if values.device.type == "cpu" and n >= RADIX_MIN:
            method = "numpy"
        else:
            method = "radix" if radix_ok and n >= RADIX_MIN else "kthvalue"
    if method == "numpy":
        flat = values.detach().reshape(-1)
        wide = flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat
        kth = np.partition(wide.cpu().numpy(), k - 1)[k - 1]
        return torch.tensor(kth, device=values.device).to(values.dtype)
    if method == "radix":
        if not radix_ok:
            raise ValueError(f"radix selection needs float16/bfloat16/float32 values, got {values.dtype}")
        return _radix_kth(values.reshape(-1).float(), k, nonneg).to(values.dtype)
    if method != "kthvalue":
        raise ValueError(f"unknown selection method {method!r}; valid choices: ['auto', 'kthvalue', 'numpy', 'radix']")
    return values.reshape(-1).kthvalue(k).values


def _radix_kth(x: Tensor, k: int, nonneg: bool = False) -> Tensor:
    """Exact k-th smallest of float32 ``x`` by two 16-bit histogram passes over order-preserving keys.

    key = bits ^ ((bits >> 31) & 0x7FFFFFFF) maps float32 to int32 monotonically (negatives included;
    NaN sorts last, as in kthvalue); for non-negative inputs (SAT's scores) the key is the bits
    themselves. Pass 1 counts the high 16 bits and finds the bucket holding the k-th key; pass 2
    counts the low 16 bits inside that bucket. Memory: about two int32 copies of ``x``.
    """
    key = x.view(torch.int32)
    if nonneg or not bool((key < 0).any()):  # no sign bit set (-0.0 has one: it takes the general path)
        return _radix_kth_nonneg(key, k)
    key = key ^ ((key >> 31) & 0x7FFFFFFF)
    high = (key >> 16) + (1 << 15)  # [0, 65536)
    b, r = _bucket(torch.bincount(high, minlength=1 << 16), k)
    low = torch.where(high == b, key & 0xFFFF, 1 << 16)  # outside the bucket: an extra, ignored bin
    del high
    j, _ = _bucket(torch.bincount(low, minlength=(1 << 16) + 1)[: 1 << 16], r)
    out = torch.tensor(((b - (1 << 15)) << 16) | j, dtype=torch.int64, device=x.device).to(torch.int32)
    out = out ^ ((out >> 31) & 0x7FFFFFFF)  # the key map is an involution
    return out.view(torch.float32)


def _radix_kth_nonneg(key: Tensor, k: int) -> Tensor:
    """:func:`_radix_kth` for keys >= 0 (the bits of non-negative floats): high 16 bits in [0, 32768).

    Pass 2 is key - bucket start clamped to [0, 65536]: keys below the bucket land in bin 0 with the
    bucket's own low-bits-0 keys and are subtracted back out (their number is known from pass 1),
    keys above it land in bin 65536; two elementwise passes instead of three.
    """
    b, r = _bucket(torch.bincount(key >> 16, minlength=1 << 15), k)
    low = torch.sub(key, b << 16).clamp_(0, 1 << 16)
    counts = torch.bincount(low, minlength=(1 << 16) + 1)[: 1 << 16]
    del low
    counts[0] -= k - r  # the keys below the bucket
    j, _ = _bucket(counts, r)
    return torch.tensor((b << 16) | j, dtype=torch.int32, device=key.device).view(torch.float32)


def _bucket(counts: Tensor, k: int) -> tuple[int, int]:
    """(index of the bin holding the k-th element, its rank inside that bin)."""
    cum = counts.cumsum(0)
    b = int(torch.searchsorted(cum, torch.tensor([k], device=cum.device, dtype=cum.dtype)).item())
    before = int(cum[b - 1].item()) if b > 0 else 0
    return b, k - before


SAMPLE = 1 << 15  # _kth_and_above: size of the strided sample that brackets q
MARGIN = 0.01  # ... and how far below q's rank (as a share of the entries) the bracket is put


def _kth_and_above(s: Tensor, k: int, d: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(q, idx, d_g) for float32 scores ``s`` >= 0 (``abs`` outputs): q = the k-th smallest entry (as
    :func:`kth_smallest`), idx = the ascending flat positions with s > q (empty when q = 0) and, when the
    scores are ``|d|`` and ``d`` is given, d_g = d at idx (else None).

    One full pass instead of a selection over all scores plus the gate's compare: a strided
    sample of ``SAMPLE`` entries gives a value v whose rank is about ``MARGIN`` below q's; every entry
    not below v is a candidate (one compare and one ``nonzero``, the ``nonzero`` the gate needs anyway).
    The compare is on the bits as int32, which order non-negative floats as kthvalue does, NaN last (so
    NaN is a candidate), and is faster than the float compare plus its negation. If fewer than k
    entries lie below v, q is exactly the (k - below)-th smallest candidate and the gate is the
    candidates above it; otherwise (a sample that missed, e.g. adversarial data) the exact selection over
    all scores runs. Exact either way, and a pure function of ``s``.
    """
    flat = s.reshape(-1)
    n = flat.numel()
    j = int((k / n - MARGIN) * min(n, SAMPLE))
    if j >= 1:
        v = flat[:: max(1, n // SAMPLE)][: min(n, SAMPLE)].kthvalue(j).values
        cand = flat_nonzero(flat.view(torch.int32) >= v.view(torch.int32))
        below = n - cand.numel()
        if below < k:
            # With d, gather it at the candidates once: |d| there is the scores, and d at idx a small gather.
            d_c = None if d is None else d.reshape(-1).index_select(0, cand)
            cv = flat.index_select(0, cand) if d_c is None else d_c.abs()
            q = kth_smallest(cv, k - below, nonneg=True)
            if not bool(q > 0):
                return q, cand[:0], None if d_c is None else d_c[:0]
            # float compare: NaN is never gated, as s > q. nonzero + gather: faster than masked_select.
            sel = flat_nonzero(cv > q)
            return q, cand.index_select(0, sel), None if d_c is None else d_c.index_select(0, sel)
    q = kth_smallest(flat, k, nonneg=True)
    if not bool(q > 0):
        return q, torch.zeros(0, dtype=torch.int64, device=s.device), None
    return q, flat_nonzero(flat > q), None


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
    n_t = torch.tensor(float(max(g.n, 1)), device=g.q.device)
    psi = g.psi.to(torch.float32)
    # sums over the d > 0 and d < 0 tokens through products with 0/1 floats (sign(d) clamped), not `where`
    # (unvectorized on CPU); the summed tensors, hence the sums, are the same bit for bit
    sign = torch.sign(g.d.to(torch.float32)).nan_to_num_(0.0)  # NaN d: no side
    pos = sign.clamp(min=0.0)
    deficit = 1.0 - psi
    deficit_hi = (deficit * pos).sum()  # sum of (1 - c+) over active tokens
    deficit_lo = (deficit * (pos - sign)).sum()  # pos - sign: 1 where d < 0, else 0
    c = torch.maximum(psi, 1.0 - sign.abs())  # psi where d != 0, else 1 (no outward side)
    return {
        "q": g.q.to(torch.float32),
        "gate_rate": torch.tensor(float(g.idx.numel()), device=g.q.device) / n_t,
        "eps_low_mean": eps_low - eps_low * deficit_lo / n_t,
        "eps_high_mean": eps_high - eps_high * deficit_hi / n_t,
        "c_min": c.min().clamp(max=1.0) if c.numel() else torch.ones((), device=g.q.device),
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
# |d| itself), declares ``zero_masked`` (its values are abs() values, exactly 0 on masked positions) and what
# it needs beyond the log-probs (``lag``: integrations that pass no per-token lags offer only the others).
SAT_PROXIES = component_registry("SAT proxy")


@SAT_PROXIES.register("log_ratio", traits={"zero_masked": True})
def _log_ratio_score(inp: ObjectiveInputs) -> Tensor | None:
    """|d| (the paper): None, so sat_gate ranks |d| (``inp.abs_d`` when the caller computed it)."""
    return None


@SAT_PROXIES.register("prob_diff", traits={"zero_masked": True})
def _prob_diff_score(inp: ObjectiveInputs) -> Tensor:
    """|pi - mu| of the sampled token."""
    return masked((inp.logp.detach().exp() - inp.denom_logp.exp()).abs(), inp.mask)


@SAT_PROXIES.register("version_age", needs=("lag",), traits={"zero_masked": False})
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
    g = gate_from_inputs(d, mask, inp, alpha, exponent, invert, proxy, shuffle)
    with torch.no_grad():
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
        pos = g.idx.index_select(0, hit)
        n_t = torch.tensor(float(max(g.n, 1)), device=ratio.device)
        # tokens newly clipped by SAT: past the contracted endpoint but inside PPO's interval
        new_high = torch.count_nonzero(up & ~(r_h > 1.0 + eps_high)) / n_t
        new_low = torch.count_nonzero(~up & ~(r_h < 1.0 - eps_low)) / n_t
    # PPO with a sparse override: the loss is the constant -bound*A (zero gradient) on the hit tokens
    loss, clipped, metrics = _clip(ratio, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip, (pos, value), inp.n)
    metrics.update(sat_metrics(g, eps_low, eps_high))
    metrics["clipfrac_high"] += new_high
    metrics["clipfrac_low"] += new_low
    # The only tokens whose gradient SAT changes (Prop. 4.1 (iii)): if this is 0, SAT == PPO this step.
    metrics["sat_clipfrac"] = new_high + new_low
    return loss, clipped, metrics
