import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.diagnostics import decompose_mismatch, gate_tv_share, mismatch_stats

NAN, INF = float("nan"), float("inf")


def _case():
    # Active d = [0.5, -1.0, 0.0, -2.0]; inactive positions hold garbage.
    logp = torch.tensor([[-1.0, -2.0, NAN], [-0.5, INF, -3.0]])
    behavior = torch.tensor([[-1.5, -1.0, 5.0], [-0.5, NAN, -1.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    return logp, behavior, mask


def test_mismatch_stats_hand_values():
    logp, behavior, mask = _case()
    s = mismatch_stats(logp, behavior, mask)
    assert s["d_pi"].item() == 0.875  # (0.5 + 1 + 0 + 2) / 4
    assert s["d_mean"].item() == -0.625  # (0.5 - 1 + 0 - 2) / 4
    assert s["d_max_abs"].item() == 2.0
    assert math.isclose(s["d_p90_abs"].item(), 1.7)  # sorted [0, .5, 1, 2], pos 2.7 -> 1 + .7 * 1
    assert s["logratio_var"].item() == 0.921875  # (1.125² + .375² + .625² + 1.375²) / 4
    assert all(v.dim() == 0 and not v.requires_grad for v in s.values())


def test_mismatch_stats_ignores_padding_and_float_mask():
    logp, behavior, mask = _case()
    a = mismatch_stats(logp, behavior, mask)
    logp2 = torch.where(mask, logp, torch.full_like(logp, -1e30))
    b = mismatch_stats(logp2, behavior, mask.float())
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_mismatch_stats_matches_torch_reference():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(6, 50, generator=g) * 4
    behavior = logp + 0.1 * torch.randn(6, 50, generator=g)
    mask = torch.rand(6, 50, generator=g) < 0.7
    s = mismatch_stats(logp.requires_grad_(), behavior, mask)
    d = (logp - behavior).detach().double()[mask]
    assert math.isclose(s["d_pi"].item(), d.abs().mean().item(), rel_tol=1e-12)
    assert math.isclose(s["d_p90_abs"].item(), torch.quantile(d.abs(), 0.9).item(), rel_tol=1e-12)
    assert math.isclose(s["logratio_var"].item(), d.var(unbiased=False).item(), rel_tol=1e-9)


def test_mismatch_stats_empty_mask_is_zero():
    s = mismatch_stats(torch.full((2, 3), NAN), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert all(v.item() == 0.0 for v in s.values())


def test_decompose_hand_values_and_padding():
    logp = torch.tensor([[-1.0, -2.0, NAN]])
    at_version = torch.tensor([[-1.25, -1.5, INF]])
    behavior = torch.tensor([[-1.5, -1.0, 3.0]])
    mask = torch.tensor([[True, True, False]])
    r = decompose_mismatch(logp, at_version, behavior, mask)
    assert r["tok/delta_pi"].tolist() == [[0.25, -0.5, 0.0]]
    assert r["tok/delta_impl"].tolist() == [[0.25, -0.5, 0.0]]
    assert r["tok/d"].tolist() == [[0.5, -1.0, 0.0]]
    assert r["d_policy"].item() == 0.375 and r["d_impl"].item() == 0.375
    assert r["frac_policy"].item() == 0.5 and r["frac_impl"].item() == 0.5


def test_decompose_pure_lag_and_pure_impl():
    x = torch.tensor([[-1.0, -2.0]])
    y = torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    lag_only = decompose_mismatch(x, y, y, mask)  # engine == trainer at version ℓ
    assert lag_only["frac_policy"].item() == 1.0 and lag_only["d_impl"].item() == 0.0
    impl_only = decompose_mismatch(x, x, y, mask)  # weights did not move
    assert impl_only["frac_impl"].item() == 1.0 and impl_only["d_policy"].item() == 0.0
    none = decompose_mismatch(x, x, x, mask)
    assert none["frac_policy"].item() == 0.0 and none["frac_impl"].item() == 0.0


def test_decompose_identity_bitwise_for_float32_logprobs():
    # float32 log-probs in [-32, -2**-24]: every difference is exact in float64 (see docstring).
    g = torch.Generator().manual_seed(1)
    n = 20000
    expo = torch.empty(3, n).uniform_(-24, 5, generator=g)
    a, b, c = (-(2.0**expo)).float().unbind(0)
    mask = torch.ones(1, n, dtype=torch.bool)
    r = decompose_mismatch(a[None], b[None], c[None], mask)
    assert torch.equal(r["tok/delta_pi"] + r["tok/delta_impl"], r["tok/d"])
    # and d is the float64 image of the float32 log-ratio inputs
    assert torch.equal(r["tok/d"], a[None].double() - c[None].double())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.floats(-1e6, 0.0, allow_nan=False, width=64)] * 3), min_size=1, max_size=20))
def test_decompose_identity_bound_any_float64(triples):
    t = torch.tensor(triples, dtype=torch.float64).T[:, None, :]  # [3, 1, N]
    mask = torch.ones(t.shape[1:], dtype=torch.bool)
    r = decompose_mismatch(t[0], t[1], t[2], mask)
    err = (r["tok/delta_pi"] + r["tok/delta_impl"] - r["tok/d"]).abs()
    bound = 2.0**-50 * t.abs().amax(dim=0)
    assert bool((err <= bound).all())


def test_gate_tv_share_hand_values():
    p = torch.tensor([[0.5, 0.2, 0.9, 0.3, 0.99]])
    mu = torch.tensor([[0.3, 0.2, 0.5, 0.3, 0.01]])
    gate = torch.tensor([[True, False, False, True, True]])
    mask = torch.tensor([[True, True, True, True, False]])  # last: huge TV mass, gated, but padding
    r = gate_tv_share(p.log(), mu.log(), gate, mask)
    # TV mass m = [0.1, 0, 0.2, 0]; gated active mass 0.1 of 0.3; gate rate 2/4
    assert math.isclose(r["tv_share"].item(), 1 / 3, rel_tol=1e-6)
    assert r["gate_rate"].item() == 0.5
    assert math.isclose(r["tv_lift"].item(), 2 / 3, rel_tol=1e-6)
    assert math.isclose(r["tv_mass_mean"].item(), 0.075, rel_tol=1e-6)


def test_gate_tv_share_undefined_cases():
    lp = torch.log(torch.tensor([[0.5, 0.4]]))
    mu = torch.log(torch.tensor([[0.4, 0.4]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    no_gate = gate_tv_share(lp, mu, torch.zeros(1, 2, dtype=torch.bool), mask)
    assert no_gate["tv_share"].item() == 0.0 and no_gate["gate_rate"].item() == 0.0
    assert math.isnan(no_gate["tv_lift"].item())
    no_mass = gate_tv_share(mu, mu, torch.ones(1, 2, dtype=torch.bool), mask)
    assert no_mass["tv_share"].item() == 0.0 and math.isnan(no_mass["tv_lift"].item())
    all_gated = gate_tv_share(lp, mu, torch.ones(1, 2, dtype=torch.bool), mask)
    assert all_gated["tv_share"].item() == 1.0 and all_gated["tv_lift"].item() == 1.0


def test_shape_mismatch_names_the_argument():
    with pytest.raises(ValueError, match="behavior_logp"):
        mismatch_stats(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
