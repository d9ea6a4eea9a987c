"""Exact paired tests for comparisons over seeds: the sign-flip p-value (two-sided, one-sided, and the two one-sided
tests of an equivalence), Holm's correction, Student's t
quantiles without scipy, the minimum detectable effect at a seed count (the paired-t formula, and the sign-flip
test's own from its simulated power), and the interval that inverts the sign-flip test.

Why these: with 5-10 seeds a bootstrap interval is too narrow to decide anything (its coverage is in
docs/benchmarks.md), a paired sign-flip test is exact at any n under the symmetric null, and a grid that
compares many cells must correct for it (Holm controls the family-wise error rate without assumptions).
Pure numpy; every function is checked against hand-derived values in tests/experiments/test_significance.py.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["holm", "iut_mde", "mde", "sign_flip_interval", "sign_flip_mde", "sign_flip_p", "sign_flip_p_greater",
           "sign_flip_power", "t_quantile", "tost_p", "tost_parts"]


def _clean(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def _signs(n: int) -> np.ndarray:
    """All 2^n sign patterns, [2^n, n] floats, row 0 all +1 (read-only: up to 16 diffs, 8 MB, built once per n;
    an interval tries thousands of shifts, each a p-value over them). Row 2^n - 1 - k is row k negated, so the
    first 2^(n-1) rows (the last diff unflipped) hold every |signed sum| once."""
    return _signs_cached(n) if n <= 16 else _build_signs(n)


def _build_signs(n: int) -> np.ndarray:
    return (1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)).astype(float)


@functools.lru_cache(maxsize=16)
def _signs_cached(n: int) -> np.ndarray:
    signs = _build_signs(n)
    signs.flags.writeable = False
    return signs


# Sign-flip p-values enumerate all 2^n patterns up to this many diffs; above it, a seeded Monte Carlo sample.
_EXACT_P_N = 20
_MC_PATTERNS = 200_000


def _pattern_share(d: np.ndarray, extreme) -> float:
    """Share of the sign patterns of ``d`` whose signed sum s (a vector over patterns) is ``extreme(s)``: all 2^n
    patterns up to 20 diffs (exact, the observed one among them); above that, 200,000 seeded random patterns plus
    the observed one, which always counts (so p is never 0)."""
    n = d.size
    if n <= _EXACT_P_N:
        return float(extreme(_signs(n) @ d).mean())
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(_MC_PATTERNS, n))
    return float((extreme(signs @ d).sum() + 1) / (_MC_PATTERNS + 1))


def _two_sided_share(dc: np.ndarray) -> np.ndarray:
    """For each row of ``dc`` [m, n] (n <= 20 diffs), the exact two-sided sign-flip p-value [m]: the share of the
    2^n sign patterns whose |signed sum| is at least the row's observed |sum| (ties within :func:`_tol` count as
    extreme). A pattern and its mirror image (every sign flipped) have the same |sum|, so it counts the half of
    the patterns that holds each |sum| once, twice: the same exact fraction of 2^n, at half the work."""
    n = dc.shape[1]
    observed = np.abs(dc.sum(axis=1))
    tol = 1e-12 * np.maximum(1.0, np.abs(dc).sum(axis=1))
    sums = dc @ _half_signs_t(n)  # [m, 2^(n-1)]
    np.abs(sums, out=sums)  # in place: with a power estimate's 4,000 rows it is 65 MB
    return 2 * (sums >= (observed - tol)[:, None]).sum(axis=1) / 2**n


def _tol(d: np.ndarray) -> float:
    # a relative tolerance, so that floating-point noise in the sums does not break ties
    return 1e-12 * max(1.0, float(np.abs(d).sum()))


def sign_flip_p(diffs) -> float:
    """Exact two-sided paired sign-flip (permutation) p-value of the mean of ``diffs``.

    Under H0 (no effect, symmetric paired differences) every sign pattern of the |diffs| is equally
    likely; p = share of the 2^n patterns whose |mean| is at least the observed |mean| (ties count as
    extreme, so the observed pattern always counts). Exact for n <= 20; above that, a seeded Monte Carlo of
    200,000 patterns (plus the observed one). Five positive diffs give 2/32 = 0.0625: with 5 seeds no
    two-sided test at 0.05 can succeed. NaNs are dropped; no data gives 1.0.
    """
    d = _clean(diffs)
    if d.size == 0 or not np.any(d):
        return 1.0
    if d.size <= _EXACT_P_N:
        return float(_two_sided_share(d[None, :])[0])
    observed, tol = abs(d.sum()), _tol(d)
    return _pattern_share(d, lambda sums: np.abs(sums) >= observed - tol)


def sign_flip_p_greater(diffs) -> float:
    """Exact one-sided paired sign-flip p-value of H0 "mean <= 0" against H1 "mean > 0" for ``diffs`` [n]:

        p = #{sign patterns e in {-1, +1}^n : sum_i e_i |d_i| >= sum_i d_i} / 2^n

    the share of the 2^n patterns whose sum is at least the observed sum (ties count as extreme, so the observed
    pattern always counts and p >= 1/2^n). It is exact at the null's boundary, mean 0 with symmetric differences,
    the least favourable case of "mean <= 0" (Fisher's randomization test of paired differences, Fisher 1935, *The
    Design of Experiments*, ch. III); for H0 "mean >= 0", call it on ``-diffs``. Exact for n <= 20, above that the seeded Monte Carlo of
    :func:`sign_flip_p`. Where the observed sum is not 0, the two-sided p is twice the one-sided p of the observed
    side. Three diffs +1, +2, +3: sums >= 6 only with no flip, p = 1/8. NaNs dropped; no data gives 1.0.
    """
    d = _clean(diffs)
    if d.size == 0:
        return 1.0
    observed, tol = d.sum(), _tol(d)
    return _pattern_share(d, lambda sums: sums >= observed - tol)


def tost_parts(diffs, margin: float) -> tuple[float, float]:
    """The two one-sided sign-flip tests (TOST) of equivalence within ±``margin`` of the mean paired difference
    of ``diffs`` [n] (Schuirmann 1987, "A comparison of the two one-sided tests procedure and the power approach
    for assessing the equivalence of average bioavailability", J. Pharmacokinet. Biopharm. 15(6); here with the
    exact sign-flip test for each side in place of Schuirmann's t-tests):

        p1 = sign_flip_p_greater(d + margin)    H0: mean <= -margin   (against mean > -margin)
        p2 = sign_flip_p_greater(margin - d)    H0: mean >= +margin   (against mean < +margin)

    Returns (p1, p2); the equivalence p is their max (:func:`tost_p`). ``margin`` is in the diffs' units, >= 0.
    """
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"the equivalence margin must be a finite number >= 0, got {margin}")
    d = _clean(diffs)
    return sign_flip_p_greater(d + margin), sign_flip_p_greater(margin - d)


def tost_p(diffs, margin: float) -> float:
    """TOST p-value of equivalence within ±``margin`` (:func:`tost_parts`): p = max(p1, p2). Equivalence is
    shown at level alpha when p < alpha, i.e. both one-sided nulls are rejected at alpha, no correction needed
    (an intersection-union test, Berger & Hsu 1996, Statist. Sci. 11(4)). Where the means of d ± margin are not
    0, that is the (1 - 2 alpha) two-sided sign-flip interval lying inside (-margin, +margin) (90 % at 0.05).
    No data gives 1.0; a margin of 0 gives p >= 0.5 (every pattern's sum is >= or <= the observed one)."""
    return max(tost_parts(diffs, margin))


def holm(pvalues) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order: sort ascending, multiply the i-th smallest
    (0-based) by (m - i), take the running maximum, cap at 1. E.g. [0.01, 0.04, 0.03] -> [0.03, 0.06, 0.06].
    NaN p-values are passed through as NaN and do not count towards m."""
    p = np.asarray(pvalues, dtype=float).ravel()
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    running = 0.0
    for i, j in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return [float(v) for v in out]


def _t_cdf(t: float, df: int) -> float:
    """Student's t CDF for an integer df >= 1 (Abramowitz & Stegun 26.7.3/26.7.4, closed form)."""
    theta = np.arctan(t / np.sqrt(df))
    c2, sin = np.cos(theta) ** 2, np.sin(theta)
    if df == 1:
        a = 2 * theta / np.pi
    elif df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0
        for k in range(1, (df - 1) // 2):
            term *= (2 * k) / (2 * k + 1) * c2
            total += term
        a = 2 / np.pi * (theta + sin * np.cos(theta) * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        a = sin * total
    return float(0.5 + 0.5 * a)


def t_quantile(q: float, df: int) -> float:
    """Quantile of Student's t with integer ``df`` (bisection on :func:`_t_cdf`, to 1e-10)."""
    if not 0.0 < q < 1.0 or df < 1:
        raise ValueError(f"need 0 < q < 1 and df >= 1, got q={q}, df={df}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


def mde(paired_sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable paired effect: the true mean difference that a two-sided paired test at level
    ``alpha`` detects with probability ``power`` from ``n`` seeds with paired-difference SD ``paired_sd``,

        mde = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * paired_sd / sqrt(n)

    (the paired t-test's power, which the exact sign-flip test approaches). When even the most extreme
    sign pattern cannot reach ``alpha`` (2 / 2^n > alpha, e.g. n = 5 at 0.05) nothing is detectable and the
    result is inf. E.g. mde(1, 10) = (2.262 + 0.883) / sqrt(10) = 0.995.
    """
    if n < 2 or not np.isfinite(paired_sd):
        return float("inf")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    if 2.0 / 2**n > alpha:
        return float("inf")
    return float((t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * paired_sd / np.sqrt(n))


# The sign-flip test's own interval and power. Exact enumeration up to this many seeds (2^12 patterns);
# above it the interval is found by bisection and the MDE falls back to the paired-t formula (mde).
_EXACT_N = 12


def sign_flip_interval(diffs, ci: float = 0.95) -> tuple[float, float]:
    """The shifts delta that the exact two-sided sign-flip test of ``diffs - delta`` does not reject at level
    1 - ``ci`` (p >= 1 - ci, the report's rule "reject when p < alpha"): the interval that inverts the test.

    The p-value of ``diffs - delta`` changes only where a sign pattern's |sum| crosses the observed one, i.e. at
    a mean of a subset of the diffs, and ties count as extreme, so the accepted set is closed with its ends at
    subset means: up to 12 diffs every subset mean is tried (exact); above that, each end is found by
    bisection between the mean (p = 1) and the range's end. It is the hull of the accepted shifts. When the
    test cannot reject at all (2 / 2^n >= 1 - ci, e.g. 5 diffs at 95 %) the interval is (-inf, inf); no data:
    (nan, nan). E.g. diffs 1..5 at 90 %: [1, 5] (derived in tests/experiments/test_significance.py).
    """
    d = _clean(diffs)
    n, alpha = d.size, 1.0 - ci
    if n == 0:
        return float("nan"), float("nan")
    if 2.0 / 2**n >= alpha:
        return float("-inf"), float("inf")
    if n <= _EXACT_N:
        subset = _signs(n)[1:] < 0  # every non-empty subset of the diffs (as the seeds flipped)
        cand = np.unique((subset @ d) / subset.sum(axis=1))
        return float(cand[_first_accepted(d, cand, alpha)]), float(cand[::-1][_first_accepted(d, cand[::-1], alpha)])
    return _bisect_end(d, alpha, float(d.min())), _bisect_end(d, alpha, float(d.max()))


def _accepted(d: np.ndarray, shifts: np.ndarray, alpha: float) -> np.ndarray:
    """``sign_flip_p(d - c) >= alpha`` for each shift c of ``shifts`` [m] (n <= 20 diffs), all at once."""
    return _two_sided_share(d[None, :] - shifts[:, None]) >= alpha


def _first_accepted(d: np.ndarray, shifts: np.ndarray, alpha: float) -> int:
    """Index of the first shift in ``shifts`` that the test accepts: the accepted set's hull end on that side
    (shifts sorted outward in), tried a block at a time so that the shifts inside the interval are not all tried."""
    block = max(1, 2**20 // 2 ** (d.size - 1))
    for start in range(0, shifts.size, block):
        ok = np.flatnonzero(_accepted(d, shifts[start : start + block], alpha))
        if ok.size:
            return start + int(ok[0])
    raise ValueError("the sign-flip test accepts no shift")  # never: the mean's shift has p = 1


def _bisect_end(d: np.ndarray, alpha: float, outside: float) -> float:
    """The accepted shift nearest ``outside`` (a shift the test rejects) on the way from the mean (accepted)."""
    inside = float(d.mean())
    for _ in range(60):
        mid = 0.5 * (inside + outside)
        inside, outside = (mid, outside) if sign_flip_p(d - mid) >= alpha else (inside, mid)
    return inside


_POWER_SIMS = 4000  # normal samples per power estimate: its Monte Carlo SE is about 0.006 at power 0.8


@functools.lru_cache(maxsize=256)
def _normal_draws(n: int, sims: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((sims, n))


def sign_flip_power(effect: float, n: int, alpha: float = 0.05, sims: int = _POWER_SIMS, seed: int = 0) -> float:
    """Power of the exact two-sided sign-flip test at level ``alpha`` (reject when p < alpha) to find a true mean
    difference of ``effect`` paired SDs in its sign's direction from ``n`` normal paired differences: the share
    of ``sims`` seeded samples N(effect, 1)^n that it rejects with the mean on the effect's side. Up to 12 seeds;
    the same draws for every effect (common random numbers), so the power is smooth in the effect."""
    if not 2 <= n <= _EXACT_N:
        raise ValueError(f"exact sign-flip power needs 2 <= n <= {_EXACT_N}, got {n}")
    x = _normal_draws(n, sims, seed) + abs(effect)  # [sims, n]
    return float(((_two_sided_share(x) < alpha) & (x.sum(axis=1) > 0)).mean())


def _half_signs_t(n: int) -> np.ndarray:
    """The first half of :func:`_signs` (the last diff unflipped), transposed to [n, 2^(n-1)] and contiguous:
    one matrix product with it is one BLAS call. Kept up to 16 diffs (4 MB), as :func:`_signs`."""
    return _half_signs_t_cached(n) if n <= 16 else np.ascontiguousarray(_signs(n)[: 2 ** (n - 1)].T)


@functools.lru_cache(maxsize=16)
def _half_signs_t_cached(n: int) -> np.ndarray:
    half = np.ascontiguousarray(_signs(n)[: 2 ** (n - 1)].T)
    half.flags.writeable = False
    return half


@functools.lru_cache(maxsize=256)
def _mde_sd(n: int, alpha: float, power: float) -> float:
    """The effect, in paired SDs, that the sign-flip test detects with ``power`` (bisection on the power)."""
    lo, hi = 0.0, 1.0
    while sign_flip_power(hi, n, alpha) < power:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sign_flip_power(mid, n, alpha) < power else (lo, mid)
    return hi


def sign_flip_mde(paired_sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable paired effect of the exact sign-flip test itself: the true mean difference that the
    two-sided test at level ``alpha`` finds with probability ``power`` from ``n`` normal paired differences of SD
    ``paired_sd`` (:func:`sign_flip_power`, seeded simulation). It is above the paired-t formula :func:`mde`
    at few seeds: at n = 10, alpha 0.01 it is about 1.38 SDs, where the t formula's 1.31 has about 0.75 power. inf when the
    test cannot reject (2 / 2^n >= alpha); above 12 seeds, where the two agree closely, :func:`mde`."""
    if n < 2 or not np.isfinite(paired_sd):
        return float("inf")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    if 2.0 / 2**n >= alpha:
        return float("inf")
    if n > _EXACT_N:
        return mde(paired_sd, n, alpha, power)
    return float(_mde_sd(n, float(alpha), float(power)) * paired_sd)


def iut_mde(paired_sds, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """MDE of an intersection-union test, which is supported only if all k comparisons reject: a true
    difference this large in every comparison makes each reject with power ** (1/k), so all k do with at least
    ``power`` if the rejections are independent or positively associated (comparisons that share the method's
    runs are). It is the largest SD's :func:`sign_flip_mde` at that per-comparison power: an upper bound."""
    sds = _clean(paired_sds)
    if sds.size == 0:
        return float("inf")
    return sign_flip_mde(float(sds.max()), n, alpha, power ** (1.0 / sds.size))
