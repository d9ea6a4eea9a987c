import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.diagnostics import by_lag, lag_stats

NAN = float("nan")


def test_by_lag_hand_values():
    lag = torch.tensor([[0, 0, 2], [2, 2, 7]])
    mask = torch.tensor([[True, True, True], [True, True, False]])  # lag 7 only on padding
    clipped = torch.tensor([[True, False, True], [False, False, True]])
    abs_d = torch.tensor([[0.1, 0.3, 0.5], [0.25, 0.75, NAN]])
    r = by_lag(lag, mask, clipfrac=clipped, abs_d=abs_d)
    assert set(r) == {"0/frac_tokens", "0/clipfrac", "0/abs_d", "2/frac_tokens", "2/clipfrac", "2/abs_d"}
    assert r["0/frac_tokens"].item() == 0.4 and r["2/frac_tokens"].item() == 0.6
    assert r["0/clipfrac"].item() == 0.5 and math.isclose(r["2/clipfrac"].item(), 1 / 3)
    assert math.isclose(r["0/abs_d"].item(), 0.2, rel_tol=1e-6) and r["2/abs_d"].item() == 0.5


def test_by_lag_per_sequence_lag_broadcasts():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    x = torch.tensor([[1.0, 3.0, NAN], [10.0, NAN, NAN]])
    r = by_lag(torch.tensor([4, 1]), mask, x=x)
    assert r["4/x"].item() == 2.0 and r["1/x"].item() == 10.0


def test_lag_stats():
    lag = torch.tensor([[1, 3, 99], [0, 0, 0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    r = lag_stats(lag, mask)
    assert math.isclose(r["mean"].item(), 4 / 3) and r["max"].item() == 3.0 and r["min"].item() == 0.0
    assert lag_stats(lag, torch.tensor([[True, True, False], [False] * 3]))["min"].item() == 1.0
    empty = lag_stats(lag, torch.zeros_like(mask))
    assert empty["mean"].item() == 0.0 and empty["max"].item() == 0.0 and empty["min"].item() == 0.0
    assert by_lag(lag, torch.zeros_like(mask), x=lag.float()) == {}


def test_by_lag_rejects_misaligned_inputs():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="lag"):
        by_lag(torch.zeros(3, 2, dtype=torch.long), mask)
    with pytest.raises(ValueError, match="'x'"):
        by_lag(torch.zeros(2, 3, dtype=torch.long), mask, x=torch.zeros(2, 4))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.floats(-5, 5, allow_nan=False)),
        min_size=1,
        max_size=24,
    )
)
def test_by_lag_matches_naive_loop(rows):
    lag = torch.tensor([[r[0] for r in rows]])
    mask = torch.tensor([[r[1] for r in rows]])
    x = torch.tensor([[r[2] for r in rows]], dtype=torch.float64)
    x_garbage = torch.where(mask, x, torch.full_like(x, NAN))
    got = by_lag(lag, mask, x=x_garbage)
    expected = {}
    for k in sorted({r[0] for r in rows if r[1]}):
        vals = [r[2] for r in rows if r[1] and r[0] == k]
        expected[f"{k}/x"] = math.fsum(vals) / len(vals)
    assert {k for k in got if k.endswith("/x")} == set(expected)
    for k, v in expected.items():
        assert math.isclose(got[k].item(), v, rel_tol=1e-9, abs_tol=1e-12)
