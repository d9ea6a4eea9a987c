"""The one-sided sign-flip p and the two one-sided tests of equivalence (TOST), against values enumerated by hand, a
naive enumeration and the properties any such test must have."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from satrl.experiments.significance import (
    sign_flip_interval,
    sign_flip_p,
    sign_flip_p_greater,
    tost_p,
    tost_parts,
)

small = st.lists(st.integers(-6, 6).map(float), min_size=1, max_size=8)
margins = st.integers(0, 6).map(lambda m: m / 2)


def test_one_sided_hand_values():
    # [1, 2, 3]: the 8 signed sums are +6, +4 (-1), +2 (-2), 0 (-3), 0 (-1 -2), -2 (-1 -3), -4 (-2 -3), -6;
    # only the observed +6 is >= +6: p = 1/8
    assert sign_flip_p_greater([1, 2, 3]) == 1 / 8
    # [3, -1], observed +2: sums +4, +2 (observed), -2, -4: two are >= 2, p = 2/4
    assert sign_flip_p_greater([3, -1]) == 0.5
    # every sum of [-1, -2, -3] is >= the observed -6: p = 1 (H0 "mean <= 0" is not rejected by a negative mean)
    assert sign_flip_p_greater([-1, -2, -3]) == 1.0
    assert sign_flip_p_greater([]) == 1.0 and sign_flip_p_greater([0, 0]) == 1.0
    assert sign_flip_p_greater([1.0, float("nan"), 2.0, 3.0]) == 1 / 8  # NaN dropped, as sign_flip_p does


def test_tost_hand_values():
    """d = [1.5, 0, 0, 0] with margin 1.
    p1 (H0 mean <= -1): d + 1 = [2.5, 1, 1, 1], observed sum 5.5 = the sum of the absolute values, so only the
    unflipped pattern reaches it: p1 = 1/16.
    p2 (H0 mean >= +1): 1 - d = [-0.5, 1, 1, 1], observed 2.5; flipping a set S of the values v changes the sum by
    -2 sum(v_S), so it stays >= 2.5 only for S with sum(v_S) <= 0: {} and {-0.5}: p2 = 2/16.
    TOST p = max = 0.125."""
    assert tost_parts([1.5, 0, 0, 0], 1.0) == (1 / 16, 2 / 16)
    assert tost_p([1.5, 0, 0, 0], 1.0) == 0.125
    # mirrored data swap the two sides
    assert tost_parts([-1.5, 0, 0, 0], 1.0) == (2 / 16, 1 / 16)
    # d = [0.5, -0.5, 0.5, 0.5, 0.5], margin 1: d + 1 and 1 - d are all positive, so each side's only pattern at
    # least as large as the observed is the observed itself: p1 = p2 = 1/32, equivalence shown at 0.05
    assert tost_parts([0.5, -0.5, 0.5, 0.5, 0.5], 1.0) == (1 / 32, 1 / 32)
    assert tost_p([], 1.0) == 1.0
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="margin must be a finite number >= 0"):
            tost_p([1.0], bad)


def _naive_greater(d: list[float]) -> float:
    obs = sum(d)
    hits = sum(sum(s * abs(x) for s, x in zip(signs, d)) >= obs - 1e-9 for signs in itertools.product([1, -1], repeat=len(d)))
    return hits / 2 ** len(d)


@given(small, margins)
def test_matches_a_naive_enumeration(d, m):
    assert sign_flip_p_greater(d) == pytest.approx(_naive_greater(d))
    assert tost_p(d, m) == pytest.approx(max(_naive_greater([x + m for x in d]), _naive_greater([m - x for x in d])))


@given(small.filter(lambda d: sum(d) != 0))
def test_two_sided_is_twice_the_one_sided_p_of_the_observed_side(d):
    side = sign_flip_p_greater(d) if sum(d) > 0 else sign_flip_p_greater([-x for x in d])
    assert sign_flip_p(d) == pytest.approx(2 * side)


@given(small, margins)
def test_symmetric(d, m):
    """Mirroring the data swaps the two one-sided tests and leaves the TOST p unchanged."""
    p1, p2 = tost_parts(d, m)
    assert tost_parts([-x for x in d], m) == (p2, p1) and tost_p([-x for x in d], m) == tost_p(d, m)


@given(small)
def test_margin_zero_never_shows_equivalence(d):
    """With margin 0 every pattern's sum is >= or <= the observed one, so p1 + p2 >= 1 and p >= 0.5."""
    p1, p2 = tost_parts(d, 0.0)
    assert p1 + p2 >= 1.0 - 1e-12 and tost_p(d, 0.0) >= 0.5


@given(small, margins)
def test_a_wider_margin_never_raises_p(d, m):
    assert tost_p(d, m + 0.5) <= tost_p(d, m) + 1e-12


@given(st.lists(st.integers(1, 6).map(float), min_size=1, max_size=5), st.integers(0, 8), margins)
def test_p_grows_as_the_mean_moves_away_from_zero(half, k, m):
    """Data symmetric about 0 ([x, -x] pairs) shifted by c: p1 can only fall and p2 only rise as c grows, and the
    TOST p is nondecreasing in |c| (equal at c and -c)."""
    base = half + [-x for x in half]
    shifted = lambda c: [x + c for x in base]  # noqa: E731
    c0, c1 = k / 4, (k + 1) / 4
    assert tost_parts(shifted(c1), m)[0] <= tost_parts(shifted(c0), m)[0] + 1e-12
    assert tost_parts(shifted(c1), m)[1] >= tost_parts(shifted(c0), m)[1] - 1e-12
    assert tost_p(shifted(c1), m) >= tost_p(shifted(c0), m) - 1e-12
    assert tost_p(shifted(-c1), m) == pytest.approx(tost_p(shifted(c1), m))


@pytest.mark.parametrize("seed", range(12))
def test_equivalence_at_005_is_the_90_percent_interval_inside_the_margin(seed):
    """TOST rejects at 0.05 exactly when the 90 % sign-flip interval (which inverts the two-sided test at 0.10) lies
    strictly inside (-margin, +margin): each side's one-sided p is half the two-sided p of the shifted data."""
    rng = np.random.default_rng(seed)
    d = np.round(rng.normal(rng.uniform(-0.5, 0.5), 0.5, size=int(rng.integers(6, 11))), 2)
    lo, hi = sign_flip_interval(d, 0.90)
    for m in (0.3, 0.6, 0.9, 1.2):
        assert (tost_p(d, m) < 0.05) == (-m < lo and hi < m), (d.tolist(), m, lo, hi)


def test_monte_carlo_above_20_seeds():
    """25 diffs of +-1, three negative: the one-sided p is P(at most 3 of 25 random signs negative), by binomial
    count; above 20 diffs it is a seeded Monte Carlo estimate, within its own error of that."""
    d = np.r_[np.ones(22), -np.ones(3)]
    exact = sum(math.comb(25, k) for k in range(4)) / 2**25
    assert abs(sign_flip_p_greater(d) - exact) < 0.001
    assert sign_flip_p_greater(d) == sign_flip_p_greater(d)  # seeded: the same p on every call
    # TOST of d - 1 at margin 1.5: p2's values 1.5 - (d - 1) = 2.5 - d are 22 of +1.5 and 3 of +3.5, all positive, so
    # only the observed pattern counts among the random ones: (0 + 1) / 200,001. p1's values d + 0.5 (22 of +1.5, 3 of
    # -0.5) reach the observed sum only with at most one +1.5 flipped: exactly 23 * 8 / 2^25 = 5.5e-6, estimated from
    # the few random patterns that hit it
    p1, p2 = tost_parts(d - 1.0, 1.5)
    assert p2 == 1 / 200_001 and p1 < 1e-4
