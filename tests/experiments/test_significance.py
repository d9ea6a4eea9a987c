"""Exact paired tests, Holm, t quantiles, MDE and the studentized interval, against hand-derived values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from satrl.experiments.mdtext import fmt_ci
from satrl.experiments.stats import (
    compare,
    holm,
    interval_coverage,
    mde,
    paired_diff,
    sign_flip_mde,
    sign_flip_p,
    studentized_ci,
    t_quantile,
)


def test_sign_flip_hand_values():
    assert sign_flip_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # only all-+ and all-- are as extreme
    assert sign_flip_p([0.1] * 5) == pytest.approx(0.0625)
    # [1, 1, -1]: |sum| = 1; patterns with |sum| >= 1: all 8 (sums are +-1 or +-3)
    assert sign_flip_p([1, 1, -1]) == 1.0
    # [3, 1]: |sum| 4 for ++/--, 2 for +-/-+: p = 2/4
    assert sign_flip_p([3, 1]) == 0.5
    assert sign_flip_p([]) == 1.0 and sign_flip_p([0, 0, 0]) == 1.0
    assert sign_flip_p([1.0] * 10) == pytest.approx(2 / 1024)


def _naive_sign_flip(d):
    obs = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12 for signs in itertools.product([1, -1], repeat=len(d)))
    return hits / 2 ** len(d)


@given(st.lists(st.integers(-5, 5).map(float), min_size=1, max_size=9))
def test_sign_flip_matches_enumeration(d):
    assert sign_flip_p(d) == pytest.approx(_naive_sign_flip(d))


def test_sign_flip_monte_carlo_above_20():
    p = sign_flip_p(np.r_[np.ones(22), -np.ones(3)])
    exact = _binomial_two_sided_sum(25)
    assert abs(p - exact) < 0.005


def _binomial_two_sided_sum(n):
    """P(|sum of n random signs| >= 19) for 22 ones and 3 minus ones: sum 19 <=> at most 3 flips either way."""
    return 2 * sum(math.comb(n, k) for k in range(0, 4)) / 2**n


def test_holm_hand_values():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.01]) == pytest.approx([0.5, 0.02])
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # 0.8 * 2 caps at 1, and 0.9 * 1 may not undercut it
    assert holm([0.6, 0.6]) == [1.0, 1.0]  # capped at 1
    out = holm([0.02, float("nan"), 0.01])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
    assert holm([]) == []


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_properties(p):
    adj = holm(p)
    assert all(a >= x - 1e-15 and a <= 1.0 for a, x in zip(adj, p))
    order = np.argsort(p, kind="stable")
    assert all(adj[order[i]] <= adj[order[i + 1]] + 1e-15 for i in range(len(p) - 1))


def test_t_quantile_table_values():
    # standard t tables
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.975, 9) == pytest.approx(2.2622, abs=1e-4)
    assert t_quantile(0.8, 9) == pytest.approx(0.8834, abs=1e-4)
    assert t_quantile(0.995, 30) == pytest.approx(2.7500, abs=1e-4)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_mde_hand_values():
    assert mde(1.0, 10) == pytest.approx((2.2622 + 0.8834) / math.sqrt(10), abs=1e-3)
    assert mde(2.0, 10) == pytest.approx(2 * mde(1.0, 10))
    assert mde(1.0, 5) == math.inf  # 2/2^5 = 0.0625 > 0.05: the sign-flip test cannot reject
    assert mde(1.0, 6) == pytest.approx((2.5706 + 0.9195) / math.sqrt(6), abs=1e-3)
    assert mde(1.0, 1) == math.inf and mde(float("nan"), 10) == math.inf
    assert mde(1.0, 10, alpha=0.01) > mde(1.0, 10) and mde(1.0, 10, power=0.9) > mde(1.0, 10)


def test_studentized_ci_basics_and_coverage():
    assert all(math.isnan(v) for v in studentized_ci([]))
    assert studentized_ci([0.2, 0.2]) == (0.2, 0.2, 0.2)  # a constant sample: zero width
    # one seed, and two different seeds (every bootstrap t_b is 0 there), have no interval: the report shows the
    # mean alone, not "± 0.0000" (issue 34)
    for values in ([0.3], [0.2, 0.5]):
        m, lo, hi = studentized_ci(values)
        assert m == pytest.approx(np.mean(values)) and math.isnan(lo) and math.isnan(hi)
    assert fmt_ci(0.35, math.nan, math.nan) == "35.0 (no interval)"
    assert fmt_ci(0.0075, math.nan, math.nan, "{:.4f}", 1.0) == "0.0075 (no interval)"
    m, lo, hi = studentized_ci([0.1, 0.4, 0.35, 0.2, 0.3, 0.25])
    assert lo < m < hi and m == pytest.approx(0.26666666)
    # within 3 points of nominal at 5 and 10 seeds (coarse here; docs/benchmarks.md has the full run)
    for n in (5, 10):
        assert abs(interval_coverage(n, "studentized", sims=300, n_resamples=1000) - 0.95) < 0.035
    assert interval_coverage(5, "percentile", sims=300, n_resamples=1000) < 0.9  # the old one is too narrow


def test_paired_diff_and_compare_use_holm_for_verdicts():
    base = {s: 0.5 for s in range(10)}
    up = {s: 0.5 + 0.01 * (1 + s % 3) for s in range(10)}  # always better: p = 2/1024
    d = paired_diff(up, base)
    assert d.p == pytest.approx(2 / 1024) and d.n == 10 and d.wins == 10
    assert d.verdict() == "better" and d.verdict(higher_is_better=False) == "worse"
    assert d.mde == pytest.approx(sign_flip_mde(d.sd, 10)) and d.mde > mde(d.sd, 10)  # the test's own, not t's
    import pandas as pd

    rows = [dict(cell=c, lag=8, seed=s, status="finished", m=v[s]) for c, v in (("up", up), ("base", base)) for s in range(10)]
    rows += [dict(cell="five", lag=8, seed=s, status="finished", m=up[s]) for s in range(5)]
    t = compare(pd.DataFrame(rows), [("up", "base", 8), ("five", "base", 8)], "m", n_resamples=500)
    assert t["p_holm"].tolist() == pytest.approx([2 * 2 / 1024, 2 / 32])  # m=2 for the smaller, 1 for the larger
    assert t["verdict"].tolist() == ["better", "no detectable difference at this power"]
    assert math.isinf(t["mde"].iloc[1])


def test_sign_flip_interval_ends_are_those_of_every_subset_mean_tried():
    """The interval tries the subset means a block at a time from each end and stops at the first accepted: the
    same ends as trying every one with sign_flip_p and taking the accepted ones' min and max (the committed
    reports print them), on tied integer diffs and on continuous ones, up to the exact method's 12 seeds."""
    from satrl.experiments.significance import _signs, sign_flip_interval

    rng = np.random.default_rng(5)
    for n, integers, ci in ((6, True, 0.9), (8, False, 0.95), (10, True, 0.95), (12, False, 0.99), (12, True, 0.95)):
        d = rng.integers(-4, 7, n).astype(float) if integers else rng.normal(0.8, 1.0, n)
        subset = _signs(n)[1:] < 0
        cand = np.unique((subset @ d) / subset.sum(axis=1))
        ok = cand[[sign_flip_p(d - c) >= 1 - ci for c in cand]]
        assert sign_flip_interval(d, ci) == (ok.min(), ok.max())


def test_sign_flip_power_counts_the_mirrored_patterns_once_each():
    """sign_flip_power sums over half the sign patterns and counts each |sum| twice (the other half is its mirror):
    the same power as every pattern counted, tolerance and ties alike (the reports' MDEs depend on it)."""
    from satrl.experiments.significance import _normal_draws, _signs, sign_flip_power

    for n, effect, alpha in ((2, 0.0, 0.6), (6, 1.0, 0.05), (9, 0.4, 0.01), (12, 0.7, 0.05 / 7)):
        x = _normal_draws(n, 4000, 0) + effect
        sums = x @ _signs(n).T  # every pattern
        extreme = (np.abs(sums) >= np.abs(sums[:, :1]) - 1e-12 * np.abs(x).sum(axis=1, keepdims=True)).sum(axis=1)
        assert sign_flip_power(effect, n, alpha) == float(((extreme < alpha * 2**n) & (sums[:, 0] > 0)).mean())


def test_two_sided_p_counts_the_mirrored_patterns_once_each():
    """sign_flip_p counts half the sign patterns twice (a pattern and its mirror have the same |sum|): the same
    p as every pattern counted, on continuous and on tied diffs, up to the exact method's 20 diffs."""
    from satrl.experiments.significance import _signs

    rng = np.random.default_rng(8)
    for n in (1, 7, 13, 16, 18):
        for d in (rng.normal(0.4, 1.0, n), rng.integers(-3, 5, n) / 8.0):
            tol = 1e-12 * max(1.0, float(np.abs(d).sum()))
            full = float((np.abs(_signs(n) @ d) >= abs(d.sum()) - tol).mean()) if np.any(d) else 1.0
            assert sign_flip_p(d) == full
