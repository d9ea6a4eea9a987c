"""hypothesis property tests: Proposition 4.1 (i)-(iii), the gate budget, and the exact selection."""

import math
from fractions import Fraction

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.objectives import clipped_surrogate, policy_loss, sat_clip_bounds
from satrl.objectives.sat import _rank, kth_largest, kth_smallest, quantile_rank

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw, ties=False):
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if ties:
        d = torch.randint(-3, 4, (B, T), generator=g).double() * 0.05
    else:
        d = torch.randn(B, T, generator=g, dtype=torch.float64) * draw(st.floats(0.01, 1.0))
    mask = torch.rand(B, T, generator=g) < draw(st.floats(0.3, 1.0))
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    eps_low, eps_high = draw(st.floats(0.05, 0.5)), draw(st.floats(0.05, 0.5))
    alpha = draw(st.sampled_from([0.5, 0.7, 0.9, 0.95, 1.0]))
    return d, mask, adv, eps_low, eps_high, alpha


@SETTINGS
@given(batches())
def test_prop41_i_containment_and_sign_selected_endpoint(b):
    d, mask, _, eps_low, eps_high, alpha = b
    lo, hi, m, gate = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
    assert torch.all(lo >= 1 - eps_low) and torch.all(hi <= 1 + eps_high)
    assert torch.all(lo <= 1) and torch.all(hi >= 1)
    up, down = gate & (d > 0), gate & (d < 0)
    assert torch.all(hi[up] < 1 + eps_high) and torch.all(lo[up] == 1 - eps_low)
    assert torch.all(lo[down] > 1 - eps_low) and torch.all(hi[down] == 1 + eps_high)
    off = ~(up | down)
    assert torch.all(lo[off] == 1 - eps_low) and torch.all(hi[off] == 1 + eps_high)


@SETTINGS
@given(batches(), st.floats(0.3, 2.5))
def test_prop41_ii_pointwise_pessimism(b, r_scale):
    d, mask, adv, eps_low, eps_high, alpha = b
    lo, hi, _, _ = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
    r = torch.exp(d * r_scale)
    s_sat = -clipped_surrogate(r, adv, lo, hi)
    s_ppo = -clipped_surrogate(r, adv, 1 - eps_low, 1 + eps_high)
    assert torch.all(s_sat <= s_ppo + 1e-12)


@SETTINGS
@given(batches())
def test_prop41_iii_gradient_differs_only_on_outward_band(b):
    d, mask, adv, eps_low, eps_high, alpha = b
    blp = torch.full_like(d, -1.0)
    grads = {}
    for preset in ("grpo", "sat_grpo"):
        logp = (blp + d).requires_grad_()
        loss, _, _ = policy_loss(preset, logp=logp, behavior_logp=blp, adv=adv, mask=mask,
                              eps_low=eps_low, eps_high=eps_high, **({"alpha": alpha} if preset != "grpo" else {}))
        (grads[preset],) = torch.autograd.grad(loss.sum(), logp)
    lo, hi, _, _ = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
    r = torch.exp(d)
    band = ((adv > 0) & (hi < r) & (r < 1 + eps_high)) | ((adv < 0) & (1 - eps_low < r) & (r < lo))
    band &= mask
    assert torch.all(grads["sat_grpo"][band] == 0)
    assert torch.all(grads["grpo"][band] != 0)
    torch.testing.assert_close(grads["sat_grpo"][~band], grads["grpo"][~band], rtol=0, atol=0)


@SETTINGS
@given(batches(ties=True), st.booleans())
def test_gate_budget_at_most_ceil_one_minus_alpha_n(b, invert):
    d, mask, _, _, _, alpha = b
    _, _, _, gate = sat_clip_bounds(d, mask, alpha=alpha, invert=invert)
    n = int(mask.sum())
    assert int(gate.sum()) <= math.ceil((1 - alpha) * n - 1e-9)
    assert not torch.any(gate & ~mask)


def test_ties_make_fewer_gated_tokens():
    # 20 tokens, alpha = 0.9: budget 2. With the top three tied, none is strictly above q.
    d = torch.tensor([[0.01] * 17 + [0.5, 0.5, 0.5]])
    _, _, _, gate = sat_clip_bounds(d, torch.ones_like(d, dtype=torch.bool))
    assert int(gate.sum()) == 0
    d = torch.tensor([[0.01 * (i + 1) for i in range(20)]])
    _, _, _, gate = sat_clip_bounds(d, torch.ones_like(d, dtype=torch.bool))
    assert int(gate.sum()) == 2


def sorted_reference(x: torch.Tensor, k: int) -> float:
    """The k-th smallest (1-based) of a plain Python list, NaN sorting last; 0 when k < 1."""
    vals = x.double().reshape(-1).tolist()
    ordered = sorted(v for v in vals if not math.isnan(v)) + [v for v in vals if math.isnan(v)]
    return ordered[k - 1] if k >= 1 else 0.0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31 - 1),
       st.sampled_from(["normal", "ties", "tiny", "neg", "nan", "inf", "signed_zero"]), st.booleans())
def test_kth_smallest_equals_kthvalue_and_a_sorted_list(n, seed, kind, k_tensor):
    g = torch.Generator().manual_seed(seed)
    x = {"normal": lambda: torch.randn(n, generator=g).abs(),
         "ties": lambda: torch.randint(0, 4, (n,), generator=g).float(),
         "tiny": lambda: torch.rand(n, generator=g) * 1e-38,
         "neg": lambda: torch.randn(n, generator=g) * 1e3,
         "nan": lambda: torch.where(torch.rand(n, generator=g) < 0.2, float("nan"), torch.randn(n, generator=g)),
         "inf": lambda: torch.randn(n, generator=g).clamp(-1, 1) / torch.randint(0, 3, (n,), generator=g),
         "signed_zero": lambda: torch.where(torch.rand(n, generator=g) < 0.5, -0.0, torch.rand(n, generator=g)),
         }[kind]()  # fmt: skip
    k = int(torch.randint(1, n + 1, (1,), generator=g))
    got = kth_smallest(x, torch.tensor(k) if k_tensor else k)
    assert got.shape == () and got.dtype == x.dtype
    torch.testing.assert_close(got, x.kthvalue(k).values, rtol=0, atol=0, equal_nan=True)
    want = sorted_reference(x, k)
    assert (math.isnan(want) and got.isnan()) or float(got) == want
    # with a host-side bound on k (what SAT's gate passes: only that many entries are selected) the same value
    most = int(torch.randint(k, n + 1, (1,), generator=g))
    torch.testing.assert_close(kth_smallest(x, k, most), got, rtol=0, atol=0, equal_nan=True)
    # counted from the top: the k-th largest is the (n - k + 1)-th smallest (NaN the largest)
    top = kth_largest(x, n - k + 1, max(n - k + 1, most - k + 1))
    torch.testing.assert_close(top, got, rtol=0, atol=0, equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100), st.integers(0, 5000))
def test_quantile_rank_is_the_exact_ceiling(percent, n):
    """ceil(alpha n) of the decimal alpha the user wrote (alpha = percent / 100), on the host and on device."""
    alpha = percent / 100
    want = -((-percent * n) // 100)  # integer ceiling of percent * n / 100: no float anywhere
    assert quantile_rank(alpha, n) == want
    assert want == math.ceil(Fraction(percent, 100) * n)
    got = _rank(alpha, torch.tensor(n))
    assert got.dtype == torch.int64 and got.shape == () and int(got) == want


def test_quantile_rank_is_exact():
    assert quantile_rank(0.7, 10) == 7 and quantile_rank(0.9, 10) == 9 and quantile_rank(0.9, 11) == 10
    assert quantile_rank(1.0, 5) == 5 and quantile_rank(0.0, 5) == 0
    # where the float product overshoots an integer, so math.ceil(alpha * n) would be one too many
    for alpha, n, k in ((0.07, 100, 7), (0.14, 50, 7), (0.28, 100, 28), (0.55, 100, 55), (0.56, 50, 28)):
        assert math.ceil(alpha * n) == k + 1 and quantile_rank(alpha, n) == k
        assert int(_rank(alpha, torch.tensor(n))) == k


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([0.0, 0.5, 0.7, 0.9, 0.95, 0.999, 1.0]))
def test_gate_budget_bounds_the_quantiles_rank_for_every_active_count(numel, alpha):
    """SAT selects only gate_budget(alpha, numel) entries: enough for every active count n <= numel."""
    from satrl.objectives.sat import gate_budget

    budget = gate_budget(alpha, numel)
    assert all(n - quantile_rank(alpha, n) + 1 <= budget for n in range(numel + 1))
