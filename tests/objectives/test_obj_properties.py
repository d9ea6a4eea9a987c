"""hypothesis property tests: Proposition 4.1 (i)-(iii), the gate budget, and the exact selection."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.objectives import clipped_surrogate, policy_loss, sat_clip_bounds
from satrl.objectives.sat import kth_smallest, quantile_rank

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
    lo, hi, m = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
    gate = m["tok/gate"]
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
    lo, hi, _ = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
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
        loss, _ = policy_loss(preset, logp=logp, behavior_logp=blp, adv=adv, mask=mask,
                              eps_low=eps_low, eps_high=eps_high, **({"alpha": alpha} if preset != "grpo" else {}))
        (grads[preset],) = torch.autograd.grad(loss.sum(), logp)
    lo, hi, _ = sat_clip_bounds(d, mask, eps_low, eps_high, alpha)
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
    _, _, m = sat_clip_bounds(d, mask, alpha=alpha, invert=invert)
    n = int(mask.sum())
    assert int(m["tok/gate"].sum()) <= math.ceil((1 - alpha) * n - 1e-9)
    assert not torch.any(m["tok/gate"] & ~mask)


def test_ties_make_fewer_gated_tokens():
    # 20 tokens, alpha = 0.9: budget 2. With the top three tied, none is strictly above q.
    d = torch.tensor([[0.01] * 17 + [0.5, 0.5, 0.5]])
    _, _, m = sat_clip_bounds(d, torch.ones_like(d, dtype=torch.bool))
    assert int(m["tok/gate"].sum()) == 0
    d = torch.tensor([[0.01 * (i + 1) for i in range(20)]])
    _, _, m = sat_clip_bounds(d, torch.ones_like(d, dtype=torch.bool))
    assert int(m["tok/gate"].sum()) == 2


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31 - 1), st.sampled_from(["normal", "ties", "tiny", "neg"]))
def test_radix_selection_equals_kthvalue(n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    x = {"normal": lambda: torch.randn(n, generator=g).abs(),
         "ties": lambda: torch.randint(0, 4, (n,), generator=g).float(),
         "tiny": lambda: torch.rand(n, generator=g) * 1e-38,
         "neg": lambda: torch.randn(n, generator=g) * 1e3}[kind]()
    k = int(torch.randint(1, n + 1, (1,), generator=g))
    want = torch.sort(x).values[k - 1]
    assert kth_smallest(x, k, "radix") == kth_smallest(x, k, "kthvalue") == want
    assert kth_smallest(x, k, "numpy") == want


def test_quantile_rank_is_exact():
    assert quantile_rank(0.7, 10) == 7 and quantile_rank(0.9, 10) == 9 and quantile_rank(0.9, 11) == 10
    assert quantile_rank(1.0, 5) == 5 and quantile_rank(0.0, 5) == 0
