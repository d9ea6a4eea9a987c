"""Hand-derived values of the peers' presets: CISPO, SAPO, GMPO, M2PO, OPSM, and SAT on CISPO / GMPO."""

import math

import pytest
import torch

from satrl.objectives import aggregate, policy_loss


def run(preset, d, adv, mask=None, logp=None, agg="token-mean", **kw):
    """Tokens with log-ratio ``d`` (logp - behavior_logp); returns (loss_tok, d agg / d logp, metrics, tokens)."""
    d = torch.tensor(d, dtype=torch.float64)
    d = d[None] if d.dim() == 1 else d
    logp = torch.full_like(d, -1.0) if logp is None else torch.tensor(logp, dtype=torch.float64).reshape(d.shape)
    mask = torch.ones_like(d, dtype=torch.bool) if mask is None else torch.tensor(mask)
    adv = torch.tensor(adv, dtype=torch.float64)
    lp = logp.clone().requires_grad_()
    loss, m, tok = policy_loss(preset, logp=lp, behavior_logp=logp - d, adv=adv, mask=mask, **kw)
    (g,) = torch.autograd.grad(aggregate(loss, mask, agg), lp)
    return loss.detach(), g, m, tok


@pytest.mark.parametrize("d, a, w", [
    (0.5, 1.0, 1.2),             # r = 1.65 > 1.2: weight capped, gradient kept (PPO would zero it)
    (math.log(1.1), 1.0, 1.1),   # inside: weight r
    (math.log(0.5), -1.0, 0.8),  # r = 0.5 < 0.8: weight raised to 0.8, gradient kept
])
def test_cispo_weight_caps_but_never_zeroes_the_gradient(d, a, w):
    loss, g, m, tok = run("cispo", [d], [a], logp=[-2.0], eps_low=0.2, eps_high=0.2)
    assert float(loss) == pytest.approx(-w * a * -2.0)  # -sg[w] A log pi
    assert float(g) == pytest.approx(-w * a)
    assert not tok.clipped.any() and float(m["clipfrac"]) == 0.0
    assert float(m["is_clipfrac_high"] + m["is_clipfrac_low"]) == (0.0 if w == 1.1 else 1.0)


def test_cispo_defaults_have_no_lower_bound_and_cap_the_weight_at_5():
    _, g, _, _ = run("cispo", [math.log(0.01), math.log(9.0)], [1.0])
    assert g[0].tolist() == pytest.approx([-0.01 / 2, -5.0 / 2])  # token-mean over 2 tokens


@pytest.mark.parametrize("r, a, tau", [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (0.5, -1.0, 1.05), (1.5, -2.0, 1.05)])
def test_sapo_soft_gate(r, a, tau):
    loss, g, m, tok = run("sapo", [math.log(r)], [a])
    s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
    assert float(loss) == pytest.approx(-(4.0 / tau) * s * a)
    assert float(g) == pytest.approx(-4.0 * s * (1.0 - s) * r * a)  # = -A at r = 1, as PPO's -r A
    assert float(m["sapo_grad_scale"]) == pytest.approx(4.0 * s * (1.0 - s))


def test_gmpo_clips_each_token_on_its_outward_side_before_the_geometric_mean():
    # A > 0: the token with log r = 0.5 is clipped to 0.4 (no gradient); -0.1 stays.
    loss, g, m, tok = run("gmpo", [0.5, -0.1], [1.0], agg="seq-mean-token-mean")
    s = math.exp((0.4 - 0.1) / 2)
    assert loss[0].tolist() == pytest.approx([-s, -s])
    assert g[0].tolist() == pytest.approx([0.0, -s / 2])
    assert tok.clipped.tolist() == [[True, False]] and float(m["clipfrac_high"]) == 0.5
    # A < 0: only log r < -0.4 would be clipped; neither is, so both keep gradient +S/2.
    loss, g, _, _ = run("gmpo", [0.5, -0.1], [-1.0], agg="seq-mean-token-mean")
    s = math.exp((0.5 - 0.1) / 2)
    assert loss[0].tolist() == pytest.approx([s, s]) and g[0].tolist() == pytest.approx([s / 2, s / 2])


def test_m2po_masks_the_largest_second_moments_of_trust_region_tokens_only():
    # A > 0: candidates are d > 0 (d^2 = .01, .04, .09, mean .0467 > .04): drop .09 -> mean .025, stop.
    # d = -0.5 (A > 0, d < 0) is not a candidate and keeps its gradient although d^2 = .25.
    d = [0.1, 0.2, 0.3, -0.5]
    loss, g, m, tok = run("m2po", d, [1.0], agg="token-mean")
    r = [math.exp(x) for x in d]
    assert tok.clipped.tolist() == [[False, False, True, False]]
    assert loss[0].tolist() == pytest.approx([-r[0], -r[1], 0.0, -r[3]])
    assert g[0].tolist() == pytest.approx([-r[0] / 4, -r[1] / 4, 0.0, -r[3] / 4])  # over all 4 tokens
    assert float(m["m2po_mask_frac"]) == 0.25
    assert float(m["m2_before"]) == pytest.approx(0.14 / 3) and float(m["m2_after"]) == pytest.approx(0.025)
    _, _, m, tok = run("m2po", d, [1.0], m2_threshold=0.05)  # .0467 <= .05: nothing masked
    assert float(m["m2po_mask_frac"]) == 0.0


def test_opsm_drops_only_negative_advantage_responses_far_from_the_behaviour_policy():
    # mean log(mu / pi) = -mean d: 0.6, 0.6, 0.1. Response 0 (A < 0, 0.6 > delta = 0.5) is dropped,
    # including its token with r = e^0.1, which GRPO's clip leaves alone; response 1 has A > 0.
    d = [[-1.3, 0.1], [-1.3, 0.1], [-0.1, -0.1]]
    loss, g, m, tok = run("opsm", d, [-1.0, 1.0, -1.0])
    base = run("grpo", d, [-1.0, 1.0, -1.0])
    assert tok.clipped.tolist() == [[True, True], [False, False], [False, False]]
    assert torch.all(loss[0] == 0) and torch.all(g[0] == 0) and float(base[1][0, 1]) != 0.0
    assert torch.equal(loss[1:], base[0][1:]) and torch.equal(g[1:], base[1][1:]) and torch.all(g[1:] != 0)
    assert float(m["opsm_mask_frac"]) == pytest.approx(1 / 3)
    assert float(m["opsm_kl_mean"]) == pytest.approx((0.6 + 0.6 + 0.1) / 3)
    _, _, m, tok = run("opsm", d, [-1.0, 1.0, -1.0], opsm_delta=0.7)
    assert float(m["opsm_mask_frac"]) == 0.0


def ten_tokens():
    # |d| = 0.01 .. 0.10, alpha 0.9 -> q = 0.09: only d = 0.10 is gated, c+ = 1 / (1 + (0.10/0.09)^2)
    return [0.01 * (i + 1) for i in range(10)], 1.0 / (1.0 + (0.10 / 0.09) ** 2)


def test_sat_cispo_contracts_the_weight_cap_of_the_gated_token():
    d, c = ten_tokens()
    _, g, m, tok = run("sat_cispo", d, [1.0], eps_low=0.2, eps_high=0.2)
    _, g_base, _, _ = run("cispo", d, [1.0], eps_low=0.2, eps_high=0.2)
    assert math.exp(0.10) > 1 + 0.2 * c  # r = 1.105 is inside CISPO's 1.2 but above the contracted cap
    assert float(g[0, 9]) == pytest.approx(-(1 + 0.2 * c) / 10)
    assert float(g_base[0, 9]) == pytest.approx(-math.exp(0.10) / 10)
    assert torch.equal(g[0, :9], g_base[0, :9])
    assert float(m["sat_clipfrac"]) == pytest.approx(0.1) and float(m["gate_rate"]) == pytest.approx(0.1)


def test_sat_gmpo_clips_the_gated_token_at_its_contracted_log_radius():
    d, c = ten_tokens()
    _, g, m, tok = run("sat_gmpo", d, [1.0], eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean")
    assert 0.10 > 0.2 * c  # above the contracted log radius, inside GMPO's 0.2
    s = math.exp((sum(d[:9]) + 0.2 * c) / 10)
    assert float(g[0, 9]) == 0.0 and g[0, :9].tolist() == pytest.approx([-s / 10] * 9)
    assert tok.clipped.tolist() == [[False] * 9 + [True]] and float(m["sat_clipfrac"]) == pytest.approx(0.1)


@pytest.mark.parametrize("sat,base", [("sat_cispo", "cispo"), ("sat_gmpo", "gmpo"), ("sat_opsm", "opsm")])
def test_sat_gate_off_is_bit_identical_to_its_base(sat, base):
    g = torch.Generator().manual_seed(0)
    d = (torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.4).tolist()
    adv = torch.randn(6, generator=g, dtype=torch.float64).tolist()
    a = run(sat, d, adv, alpha=1.0)
    b = run(base, d, adv)
    assert float(a[2]["gate_rate"]) == 0.0
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert b[1].abs().sum() > 0
