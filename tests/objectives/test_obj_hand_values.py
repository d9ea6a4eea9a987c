"""Hand-derived values for every clipping regime, SAT's gate and kernel, DPPO masks and corrections."""

import math

import pytest
import torch

from satrl.objectives import aggregate, clipped_surrogate, policy_loss, sat_clip_bounds


def surrogate_and_grad(r, a, lo=0.8, hi=1.2, dual_clip=None):
    ratio = torch.tensor([r], dtype=torch.float64, requires_grad=True)
    loss = clipped_surrogate(ratio, torch.tensor([a], dtype=torch.float64), lo, hi, dual_clip)
    (g,) = torch.autograd.grad(loss.sum(), ratio)
    return float(loss.detach()), float(g)


@pytest.mark.parametrize("r, a, loss, grad", [
    (1.1, 1.0, -1.1, -1.0),    # A > 0, inside: unclipped
    (1.5, 1.0, -1.2, 0.0),     # A > 0, above hi: clipped, no gradient
    (0.5, 1.0, -0.5, -1.0),    # A > 0, below lo: pull-back kept
    (0.9, -2.0, 1.8, 2.0),     # A < 0, inside
    (0.5, -1.0, 0.8, 0.0),     # A < 0, below lo: clipped
    (1.5, -1.0, 1.5, 1.0),     # A < 0, above hi: pull-back kept
    (1.0, 0.0, 0.0, 0.0),      # A = 0
])
def test_ppo_clip_regimes(r, a, loss, grad):
    got_loss, got_grad = surrogate_and_grad(r, a)
    assert got_loss == pytest.approx(loss) and got_grad == pytest.approx(grad)


def test_dual_clip_bounds_negative_advantage():
    assert surrogate_and_grad(4.0, -1.0, dual_clip=3.0) == pytest.approx((3.0, 0.0))
    assert surrogate_and_grad(2.0, -1.0, dual_clip=3.0) == pytest.approx((2.0, 1.0))
    assert surrogate_and_grad(4.0, 1.0, dual_clip=3.0) == pytest.approx((-1.2, 0.0))


def ten_tokens(sign=1.0):
    # |d| = 0.01, ..., 0.10; alpha = 0.9 -> k = 9 -> q = 0.09; only |d| = 0.10 is gated.
    d = torch.tensor([[0.01 * (i + 1) for i in range(10)]], dtype=torch.float64) * sign
    return d, torch.ones_like(d, dtype=torch.bool)


def test_sat_gate_and_kernel_by_hand():
    c = 1.0 / (1.0 + (0.10 / 0.09) ** 2)  # 0.4475...
    d, mask = ten_tokens(+1.0)
    lo, hi, m, gate = sat_clip_bounds(d, mask)
    assert float(m["q"]) == pytest.approx(0.09)
    assert gate.tolist() == [[False] * 9 + [True]]
    assert all(v.dim() == 0 for v in m.values())  # metrics are scalars; per-token outputs are returned apart
    assert float(hi[0, 9]) == pytest.approx(1 + 0.2 * c) and float(lo[0, 9]) == pytest.approx(0.8)
    assert torch.all(hi[0, :9] == 1.2) and torch.all(lo == 0.8)
    assert float(m["gate_rate"]) == pytest.approx(0.1)
    assert float(m["c_min"]) == pytest.approx(c)
    assert float(m["eps_high_mean"]) == pytest.approx((9 * 0.2 + 0.2 * c) / 10)
    assert float(m["eps_low_mean"]) == pytest.approx(0.2)
    d, mask = ten_tokens(-1.0)  # negative mismatch: only the lower endpoint moves
    lo, hi, m, gate = sat_clip_bounds(d, mask)
    assert gate.tolist() == [[False] * 9 + [True]]
    assert float(lo[0, 9]) == pytest.approx(1 - 0.2 * c) and torch.all(hi == 1.2)


def test_sat_exponent_and_alpha_by_hand():
    d, mask = ten_tokens()
    lo, hi, m, gate = sat_clip_bounds(d, mask, alpha=0.8, exponent=1.0)  # k = 8, q = 0.08
    assert float(m["q"]) == pytest.approx(0.08)
    assert gate.tolist() == [[False] * 8 + [True] * 2]
    assert float(hi[0, 8]) == pytest.approx(1 + 0.2 / (1 + 0.09 / 0.08))
    assert float(hi[0, 9]) == pytest.approx(1 + 0.2 / (1 + 0.10 / 0.08))


def test_sat_invert_gates_the_bottom_share():
    d, mask = ten_tokens()
    lo, hi, m, gate = sat_clip_bounds(d, mask, invert=True)  # budget m = 1: q_lo = 2nd smallest = 0.02
    assert gate.tolist() == [[True] + [False] * 9]
    assert float(hi[0, 0]) == pytest.approx(1 + 0.2 / (1 + (0.02 / 0.01) ** 2))


def test_sat_grpo_gated_token_clipped_inside_ppo_interval():
    # token 9 has d = 0.10: r = e^0.1 = 1.105 < 1.2 (PPO keeps it) but > 1 + 0.2 c = 1.0895 (SAT clips).
    d, mask = ten_tokens()
    blp = torch.full_like(d, -1.0)
    logp = (blp + d).requires_grad_()
    adv = torch.ones(1, dtype=torch.float64)
    out = {}
    for preset in ("grpo", "sat_grpo"):
        loss, m, tok = policy_loss(preset, logp=logp, behavior_logp=blp, adv=adv, mask=mask)
        (g,) = torch.autograd.grad(aggregate(loss, mask, "seq-mean-token-sum"), logp)
        out[preset] = (loss.detach(), g, m, tok)
    c = 1.0 / (1.0 + (0.10 / 0.09) ** 2)
    assert float(out["grpo"][0][0, 9]) == pytest.approx(-math.exp(0.1))
    assert float(out["sat_grpo"][0][0, 9]) == pytest.approx(-(1 + 0.2 * c))
    assert float(out["grpo"][1][0, 9]) == pytest.approx(-math.exp(0.1))
    assert float(out["sat_grpo"][1][0, 9]) == 0.0
    assert torch.equal(out["grpo"][1][0, :9], out["sat_grpo"][1][0, :9])
    assert out["sat_grpo"][3].clipped.tolist() == [[False] * 9 + [True]]
    assert out["sat_grpo"][3].gate.tolist() == [[False] * 9 + [True]]
    assert not out["grpo"][3].gate.any() and not out["grpo"][3].clipped.any()
    assert torch.allclose(out["sat_grpo"][3].d, d)  # the token log-ratio log pi - log mu
    assert float(out["sat_grpo"][2]["clipfrac_high"]) == pytest.approx(0.1)
    assert float(out["grpo"][2]["clipfrac"]) == 0.0


def test_dppo_tv_masks_outward_only():
    # mu = 0.5; pi = 0.7 (TV 0.2 > 0.15) and pi = 0.6 (TV 0.1)
    blp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.7, 0.6, 0.7, 0.3]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones_like(blp, dtype=torch.bool)
    loss, m, tok = policy_loss("dppo_tv", logp=logp, behavior_logp=blp, adv=adv, mask=mask)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    # token 0: outward (A > 0, pi > mu) and TV 0.2 > 0.15 -> dropped; token 3: outward, TV 0.2 -> dropped
    assert tok.clipped.tolist() == [[True, False, False, True]]
    assert g[0].tolist() == pytest.approx([0.0, -1.2, 1.4, 0.0])  # d(-rA)/dlogp = -rA
    assert float(m["dppo_mask_frac"]) == pytest.approx(0.5)


def test_dppo_kl_and_paper_dppo_thresholds():
    blp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.7, 0.5005]], dtype=torch.float64))
    adv = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones_like(blp, dtype=torch.bool)
    kl = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)  # 0.0872 > 0.05
    assert kl > 0.05
    tok = policy_loss("dppo_kl", logp=logp, behavior_logp=blp, adv=adv, mask=mask).tokens
    assert tok.clipped.tolist() == [[True, False]]
    # the SAT paper's DPPO: delta = 1e-3, |pi - mu| = 5e-4 for token 1 -> kept; token 0 dropped
    tok = policy_loss("dppo_sat_paper", logp=logp, behavior_logp=blp, adv=adv, mask=mask).tokens
    assert tok.clipped.tolist() == [[True, False]]
    tok = policy_loss("dppo_sat_paper", logp=logp, behavior_logp=blp, adv=adv, mask=mask, delta=1e-4).tokens
    assert tok.clipped.tolist() == [[True, True]]


def test_corrections_by_hand():
    blp = torch.log(torch.tensor([[0.2, 0.5, 0.5]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.6, 0.5, 0.2]], dtype=torch.float64))  # k = 3, 1, 0.4
    logp = old.clone().requires_grad_()
    adv = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones_like(blp, dtype=torch.bool)
    kw = dict(logp=logp, behavior_logp=blp, adv=adv, mask=mask, old_logp=old)
    loss, m, _ = policy_loss("grpo_tis", **kw)
    assert loss.detach()[0].tolist() == pytest.approx([-2.0, -1.0, -0.4])  # r = 1, w = min(k, 2)
    assert float(m["tis_max"]) == pytest.approx(3.0) and float(m["tis_clipfrac"]) == pytest.approx(1 / 3)
    loss, m, tok = policy_loss("grpo_icepop", **kw)
    assert loss.detach()[0].tolist() == pytest.approx([0.0, -1.0, 0.0])
    assert tok.clipped.tolist() == [[True, False, True]]
    loss, m, _ = policy_loss("grpo_mis", **kw)
    assert loss.detach()[0].tolist() == pytest.approx([0.0, -1.0, -0.4])


def test_kl_estimators_by_hand():
    logp = torch.log(torch.tensor([[0.5]], dtype=torch.float64)).requires_grad_()
    ref = torch.log(torch.tensor([[0.25]], dtype=torch.float64))
    mask = torch.ones_like(ref, dtype=torch.bool)
    x = math.log(0.5)  # ref - logp
    for kl, want in (("k1", -x), ("k2", 0.5 * x * x), ("k3", math.exp(x) - x - 1)):
        loss, m, _ = policy_loss("grpo", logp=logp, behavior_logp=logp.detach(), adv=torch.zeros(1),
                              mask=mask, ref_logp=ref, kl=kl, kl_coef=1.0)
        assert float(m["kl"]) == pytest.approx(want) and float(loss.detach()) == pytest.approx(want)


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), float("nan")]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(2.0)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 3.0) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((3.0 + 3.0) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(6.0 / 2 / 3)
    assert float(aggregate(loss, torch.zeros_like(mask), "token-mean")) == 0.0
