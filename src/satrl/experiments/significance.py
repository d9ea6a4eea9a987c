"""Exact paired tests for comparisons over seeds: the sign-flip p-value, Holm's correction, Student's t
quantiles without scipy, and the minimum detectable effect at a seed count.

Why these: with 5-10 seeds a bootstrap interval is too narrow to decide anything (its coverage is in
docs/benchmarks.md), a paired sign-flip test is exact at any n under the symmetric null, and a grid that
compares many cells must correct for it (Holm controls the family-wise error rate without assumptions).
Pure numpy; every function is checked against hand-derived values in tests/experiments/test_significance.py.
"""

from __future__ import annotations

import numpy as np

__all__ = ["holm", "mde", "sign_flip_p", "t_quantile"]


def _clean(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def sign_flip_p(diffs) -> float:
    """Exact two-sided paired sign-flip (permutation) p-value of the mean of ``diffs``.

    Under H0 (no effect, symmetric paired differences) every sign pattern of the |diffs| is equally
    likely; p = share of the 2^n patterns whose |mean| is at least the observed |mean| (ties count as
    extreme, so the observed pattern always counts). Exact for n <= 20; above that, a seeded Monte Carlo of
    200,000 patterns (plus the observed one). Five positive diffs give 2/32 = 0.0625: with 5 seeds no
    two-sided test at 0.05 can succeed. NaNs are dropped; no data gives 1.0.
    """
    d = _clean(diffs)
    n = d.size
    if n == 0 or not np.any(d):
        return 1.0
    observed = abs(d.sum())
    # a relative tolerance, so that floating-point noise in the sums does not break ties
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))
    if n <= 20:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)  # [2^n, n]
        sums = np.abs(signs @ d)
        return float((sums >= observed - tol).mean())
    rng = np.random.default_rng(0)
    signs = rng.choice([-1.0, 1.0], size=(200_000, n))
    hits = (np.abs(signs @ d) >= observed - tol).sum() + 1
    return float(hits / (200_000 + 1))


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
