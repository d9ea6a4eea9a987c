"""The staleness repairs (issue 33): decoupled PPO, A-3PO, TOPR, VESPO, M2PO's official clip, verl's rejection
masks and SAT on decoupled PPO. Hand-derived values on small tensors, the properties each docstring claims
(what decoupled PPO and A-3PO reduce to with one optimizer step per batch), garbage padding, metrics.
The naive-loop equality of every preset is tests/objectives/test_obj_reference.py; verl's own masks are
compared in tests/objectives/test_repairs_verl.py."""

import math

import pytest
import torch
from test_obj_no_host_sync import SYNCING, Recorder

from satrl.objectives import aggregate, policy_loss, resolve_objective

REPAIRS = ["decoupled_ppo", "sat_decoupled_ppo", "a3po", "topr", "vespo", "m2po_official", "grpo_geo_mask",
           "grpo_k3_mask"]  # fmt: skip
F64 = torch.float64


def t(x, dtype=F64):
    x = torch.tensor(x, dtype=dtype)
    return x[None] if x.dim() == 1 else x


def run(preset, logp, blp, adv, mask=None, agg="token-mean", **kw):
    """(loss [B, T], d agg / d logp, metrics, tokens) for float64 inputs given as lists."""
    logp, blp = t(logp), t(blp)
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    for key in ("old_logp",):
        if key in kw and not isinstance(kw[key], torch.Tensor):
            kw[key] = t(kw[key])
    lp = logp.clone().requires_grad_()
    loss, m, tok = policy_loss(preset, logp=lp, behavior_logp=blp, adv=torch.tensor(adv, dtype=F64), mask=mask, **kw)
    (g,) = torch.autograd.grad(aggregate(loss, mask, agg), lp)
    return loss.detach(), g, m, tok


def batch(seed, B=6, T=9, spread=0.4, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 2 - 0.05
    blp = (logp + spread * torch.randn(B, T, generator=g, dtype=dtype)).clamp(max=-1e-3)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    adv = torch.randn(B, generator=g, dtype=dtype)
    lag = torch.randint(0, 6, (B, T), generator=g)
    return logp, blp, mask, adv, lag


def loss_grad(preset, logp, blp, mask, adv, **kw):
    lp = logp.clone().requires_grad_()
    loss, m, tok = policy_loss(preset, logp=lp, behavior_logp=blp, adv=adv, mask=mask, **kw)
    (g,) = torch.autograd.grad(aggregate(loss, mask, "token-mean"), lp)
    return loss.detach(), g, m, tok


# ------------------------------------------------------------------------------------------ decoupled PPO
def test_decoupled_ppo_hand_values_2x3():
    """k = pi_prox / mu per token; k = e^2 > 5 is dropped (AReaL masks above the cap); r = pi / pi_prox is
    clipped by PPO: r = e^0.3 > 1.2 with A > 0 loses its gradient."""
    old = [[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]]
    blp = [[-1.5, -3.0, -1.0], [-2.0, -1.9, -2.2]]  # log k = 0.5, 2.0, 0 | 0, -0.1, 0.2
    logp = [[-1.0, -0.7, -1.1], [-2.0, -2.0, -1.95]]  # log r = 0, 0.3, -0.1 | 0, 0, 0.05
    adv = [1.0, -2.0]
    loss, g, m, tok = run("decoupled_ppo", logp, blp, adv, old_logp=old)
    k = [[math.exp(0.5), 0.0, 1.0], [1.0, math.exp(-0.1), math.exp(0.2)]]  # the dropped weight is 0
    r = [[1.0, math.exp(0.3), math.exp(-0.1)], [1.0, 1.0, math.exp(0.05)]]
    want_loss = [[-k[0][0] * r[0][0], 0.0, -k[0][2] * r[0][2]], [2 * k[1][j] * r[1][j] for j in range(3)]]
    want_grad = [[-k[0][0] * r[0][0] / 6, 0.0, -k[0][2] * r[0][2] / 6], [2 * k[1][j] * r[1][j] / 6 for j in range(3)]]
    assert loss.tolist()[0] == pytest.approx(want_loss[0]) and loss.tolist()[1] == pytest.approx(want_loss[1])
    assert g.tolist()[0] == pytest.approx(want_grad[0]) and g.tolist()[1] == pytest.approx(want_grad[1])
    assert tok.clipped.tolist() == [[False, True, False], [False, False, False]]
    assert float(m["behav_imp_capfrac"]) == pytest.approx(1 / 6) and float(m["behav_imp_max"]) == pytest.approx(math.e**2)
    # r = e^0.3 is above 1 + eps: with the cap out of the way PPO's clip zeroes that token's gradient
    _, g2, m2, _ = run("decoupled_ppo", logp, blp, adv, old_logp=old, behav_imp_weight_cap=10.0)
    assert float(g2[0, 1]) == 0.0 and float(m2["clipfrac"]) == pytest.approx(1 / 6)
    # truncate: the weight is min(k, C) instead of 0
    _, g3, _, tok3 = run("decoupled_ppo", logp, blp, adv, old_logp=old, behav_imp_weight_mode="truncate", eps_high=0.5)
    assert float(g3[0, 1]) == pytest.approx(-5.0 * math.exp(0.3) / 6) and not tok3.clipped.any()


@pytest.mark.parametrize("mode, same, key", [("mask", "grpo_mis", "mis_threshold"), ("truncate", "grpo_tis", "tis_cap")])
def test_decoupled_ppo_with_one_step_per_batch_is_capped_is_policy_gradient(mode, same, key):
    """pi_theta == pi_prox at the step (old_logp = logp): r == 1, the clip never bites, and the gradient is
    -w(k) A / n with k = pi_prox / mu: grpo_mis / grpo_tis with the same cap, bit for bit."""
    logp, blp, mask, adv, _ = batch(0, spread=1.5)
    loss, g, m, tok = loss_grad("decoupled_ppo", logp, blp, mask, adv, old_logp=logp, behav_imp_weight_mode=mode)
    k = torch.exp(logp - blp)
    w = torch.where(k <= 5.0, k, 0.0) if mode == "mask" else k.clamp(max=5.0)
    want = torch.where(mask, -w * adv[:, None], 0.0) / mask.sum()
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-15)
    assert float(m["clipfrac"]) == 0.0 and float(m["behav_imp_capfrac"]) > 0  # the cap acts, the clip does not
    other = loss_grad(same, logp, blp, mask, adv, old_logp=logp, **{key: 5.0})
    assert torch.equal(loss, other[0]) and torch.equal(g, other[1])


# -------------------------------------------------------------------------------------------------- A-3PO
def test_a3po_reproduces_areal_loglinear_example():
    """AReaL's tests/test_prox_approx.py: versions [0, 2] at current version 4 (lags 4, 2): alpha 3/4, 1/2,
    log pi_prox = -1.375, -2.1 from mu = [-1, -2], pi = [-1.5, -2.2]."""
    logp, blp = [[-1.5], [-2.2]], [[-1.0], [-2.0]]
    loss, g, m, tok = run("a3po", logp, blp, [1.0, 1.0], lag=torch.tensor([[4], [2]]))
    prox = [-1.375, -2.1]
    r = [math.exp(-1.5 - prox[0]), math.exp(-2.2 - prox[1])]  # e^-0.125 and e^-0.1: inside [0.8, 1.2]
    w = [math.exp(prox[0] + 1.0), math.exp(prox[1] + 2.0)]
    assert loss[:, 0].tolist() == pytest.approx([-r[0] * w[0], -r[1] * w[1]])
    assert g[:, 0].tolist() == pytest.approx([-r[0] * w[0] / 2, -r[1] * w[1] / 2])  # = -(pi / mu) A / n
    assert g[:, 0].tolist() == pytest.approx([-math.exp(-0.5) / 2, -math.exp(-0.2) / 2])
    assert float(m["a3po_alpha_mean"]) == pytest.approx((0.75 + 0.5) / 2)


def test_a3po_clips_the_lag_th_root_of_the_stale_ratio():
    """Lag L (AReaL's alpha = (L-1)/L): r = (pi / mu)^(1/L). pi / mu = e^0.8 at lag 2 gives r = e^0.4 > 1.2:
    clipped (A > 0); at lag 4, r = e^0.2 = 1.22 > 1.2: clipped; at lag 8, r = e^0.1: kept with gradient
    -(pi / mu) A / n (w = e^0.7 < 5)."""
    loss, g, m, tok = run("a3po", [[-1.0, -1.0, -1.0]], [[-1.8, -1.8, -1.8]], [1.0], lag=torch.tensor([[2, 4, 8]]))
    assert tok.clipped.tolist() == [[True, True, False]]
    assert g[0].tolist() == pytest.approx([0.0, 0.0, -math.exp(0.8) / 3])
    assert float(loss[0, 0]) == pytest.approx(-1.2 * math.exp(0.4))  # clip(r) w = 1.2 * (pi/mu)^(1/2)


def test_a3po_at_lag_1_is_grpo_and_with_exact_proximal_is_decoupled_ppo():
    """AReaL's v_prox = v_theta - 1 gives alpha = 0 at lag 1: pi_prox = mu, w = 1, so a3po is GRPO bit for bit.
    With prox_lag = 0 (alpha = 1: the exact proximal policy with one step per batch) a3po is decoupled_ppo
    with old_logp = logp.detach(), bit for bit."""
    logp, blp, mask, adv, _ = batch(1, spread=1.5)
    ones = torch.ones_like(mask, dtype=torch.long)
    a = loss_grad("a3po", logp, blp, mask, adv, lag=ones)
    b = loss_grad("grpo", logp, blp, mask, adv)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and float(a[2]["clipfrac"]) > 0
    a = loss_grad("a3po", logp, blp, mask, adv, lag=3 * ones, prox_lag=0)
    b = loss_grad("decoupled_ppo", logp, blp, mask, adv, old_logp=logp.detach())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and float(a[2]["behav_imp_capfrac"]) > 0


def test_a3po_needs_lag():
    assert resolve_objective("a3po").needs >= {"lag"}
    with pytest.raises(ValueError, match="lag="):
        run("a3po", [[-1.0]], [[-1.0]], [1.0])


def test_a3po_lag_0_uses_mu_as_proximal():
    """AReaL's guard: v_theta == v_mu gives alpha = 0 (log pi_prox = log mu), whatever prox_lag."""
    a = run("a3po", [[-1.0, -0.5]], [[-1.1, -0.9]], [1.0], lag=torch.tensor([[0, 0]]), prox_lag=0)
    b = run("grpo", [[-1.0, -0.5]], [[-1.1, -0.9]], [1.0])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --------------------------------------------------------------------------------------------------- TOPR
def test_topr_hand_values():
    """A > 0: -A log pi (no ratio); A < 0: -clip(r, 0, 1) A log pi, with r = pi / mu."""
    logp = [[-1.0, -2.0], [-1.0, -2.0]]
    blp = [[-3.0, -0.5], [-1.5, -1.5]]  # r: e^2, e^-1.5 | e^0.5, e^-0.5
    loss, g, m, tok = run("topr", logp, blp, [2.0, -1.0])
    assert loss[0].tolist() == pytest.approx([2.0 * -1.0 * -1.0, 2.0 * -1.0 * -2.0])
    assert loss[1].tolist() == pytest.approx([-1.0 * -1.0 * -1.0, -math.exp(-0.5) * -1.0 * -2.0])
    assert g.flatten().tolist() == pytest.approx([-2 / 4, -2 / 4, 1 / 4, math.exp(-0.5) / 4])
    assert not tok.clipped.any() and float(m["topr_neg_capfrac"]) == pytest.approx(1 / 4)
    _, g2, _, _ = run("topr", logp, blp, [2.0, -1.0], topr_positive_weight=0.5, topr_negative_weight=3.0)
    assert g2.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.75, 3 * math.exp(-0.5) / 4])


def test_topr_positives_ignore_mu():
    logp, blp, mask, adv, _ = batch(2, spread=0.8)
    adv = torch.where(torch.arange(adv.numel()) % 2 == 0, adv.abs() + 0.1, -adv.abs() - 0.1)
    other = torch.where((adv > 0)[:, None], blp - 1.7 * torch.rand_like(blp), blp)  # moves mu of positives only
    a, b = loss_grad("topr", logp, blp, mask, adv), loss_grad("topr", logp, other, mask, adv)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(loss_grad("topr", logp, blp - 0.5, mask, adv)[1], a[1])  # negatives do see mu


# -------------------------------------------------------------------------------------------------- VESPO
def test_vespo_hand_values_use_the_product_of_the_ratios():
    """w = prod_t pi / mu (not the geometric mean): d = (0.3, 0.3) gives w = e^0.6; A > 0: phi = e^3 w^2
    e^(-3 w); A < 0: phi = e^2 w^3 e^(-2 w); loss = -phi A log pi."""
    logp = [[-1.0, -2.0], [-1.0, -2.0]]
    blp = [[-1.3, -2.3], [-0.9, -1.9]]  # log w: 0.6 | -0.2
    loss, g, m, tok = run("vespo", logp, blp, [1.0, -2.0])
    w0, w1 = math.exp(0.6), math.exp(-0.2)
    phi0 = math.exp(3.0) * w0**2 * math.exp(-3.0 * w0)
    phi1 = math.exp(2.0) * w1**3 * math.exp(-2.0 * w1)
    assert loss.flatten().tolist() == pytest.approx([phi0 * 1.0, phi0 * 2.0, -phi1 * 2.0, -phi1 * 4.0])
    assert g.flatten().tolist() == pytest.approx([-phi0 / 4, -phi0 / 4, 2 * phi1 / 4, 2 * phi1 / 4])
    assert float(m["vespo_phi_mean"]) == pytest.approx((phi0 + phi1) / 2) and not tok.clipped.any()


def test_vespo_is_reinforce_on_policy():
    """phi(1) = 1: with pi == mu VESPO is -A log pi, for either sign."""
    logp, _, mask, adv, _ = batch(3)
    loss, g, _, _ = loss_grad("vespo", logp, logp, mask, adv)
    torch.testing.assert_close(g, torch.where(mask, -adv[:, None], 0.0) / mask.sum(), rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------------------- M2PO (official)
def test_m2po_official_interval_hand_values():
    """A > 0 tokens with d = 0.05, 0.1, 0.3, 0.6 are all harmful (r > 1): v = d^2 = .0025, .01, .09, .36,
    mean .1156 > B = .04. With target B n = .16 the first k with v_k (n - k - 1) + sum_{i<=k} v_i >= .16 is
    k = 2 (.09 + .1025), so tau = sqrt(v_1) = 0.1: interval [e^-0.1, e^0.1]; the floors 0.3 / 0.5 widen it
    to [0.7, 1.5]."""
    d = [0.05, 0.1, 0.3, 0.6]
    logp = [[-1.0] * 4]
    blp = [[-1.0 - x for x in d]]
    loss, g, m, tok = run("m2po_official", logp, blp, [1.0], miniclip_low=None, miniclip_high=None)
    assert float(m["m2po_hi"]) == pytest.approx(math.exp(0.1)) and float(m["m2po_lo"]) == pytest.approx(math.exp(-0.1))
    assert float(m["m2po_m2"]) == pytest.approx(0.4625 / 4)
    assert float(m["m2po_m2_after"]) == pytest.approx((0.01 * 3 + 0.0025) / 4)  # the repo's capped mean at tau
    assert tok.clipped[0, 2:].tolist() == [True, True] and not tok.clipped[0, 0]
    assert float(g[0, 0]) == pytest.approx(-math.exp(0.05) / 4) and g[0, 2:].tolist() == [0.0, 0.0]
    _, g, m, tok = run("m2po_official", logp, blp, [1.0])  # floors: never tighter than [0.7, 1.5]
    assert (float(m["m2po_lo"]), float(m["m2po_hi"])) == pytest.approx((0.7, 1.5))
    assert tok.clipped.tolist() == [[False, False, False, True]]  # only r = e^0.6 > 1.5
    _, _, m, tok = run("m2po_official", logp, blp, [1.0], m2_budget=0.2, miniclip_low=None, miniclip_high=None)
    assert (float(m["m2po_lo"]), float(m["m2po_hi"])) == (0.0, 1e5) and not tok.clipped.any()  # within budget


def test_m2po_official_only_counts_harmful_tokens():
    """A > 0 with r < 1 (and A < 0 with r > 1) are not harmful: d = -0.6 with A > 0 adds nothing to the M2."""
    _, _, m, _ = run("m2po_official", [[-1.0, -1.0]], [[-1.1, -0.4]], [1.0])
    assert float(m["m2po_m2"]) == pytest.approx(0.01) and float(m["m2po_hi"]) == 1e5


def test_m2po_official_and_paper_m2po_differ():
    """The paper's M2PO masks the largest d^2 until the rest's mean is <= .04 (drops d = 0.35); the repo's
    tau = 0.1 is floored to [0.7, 1.5], which r = e^0.35 = 1.42 is inside: nothing clipped."""
    d = [0.05, 0.1, 0.3, 0.35]
    logp, blp = [[-1.0] * 4], [[-1.0 - x for x in d]]
    a, b = run("m2po", logp, blp, [1.0]), run("m2po_official", logp, blp, [1.0])
    assert a[3].clipped.tolist() == [[False, False, False, True]]
    assert not b[3].clipped.any() and float(b[2]["m2po_m2"]) > 0.04


# ------------------------------------------------------------------------------------------ verl's masks
def test_geo_mask_drops_responses_by_mean_log_ratio():
    """seq_mean_k1 in [log 0.999, log 1.001] on k1 = -log(pi_old / mu); whole responses drop."""
    old = [[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]
    blp = [[-1.0005, -0.9995], [-1.0015, -1.0015], [-0.9, -1.1]]  # means of log k: 0, 0.0015, 0 (yet |lr| = .1)
    loss, g, m, tok = run("grpo_geo_mask", old, blp, [1.0, 1.0, -1.0], old_logp=old)
    assert tok.clipped.tolist() == [[False, False], [True, True], [False, False]]
    assert torch.all(g[1] == 0) and torch.all(g[0] != 0) and float(m["geo_mask_frac"]) == pytest.approx(1 / 3)
    _, _, _, tok = run("grpo_geo_mask", old, blp, [1.0, 1.0, -1.0], old_logp=old, geo_level="token")
    assert tok.clipped.tolist() == [[False, False], [True, True], [True, True]]  # per token: |lr| = .1 drops


def test_k3_mask_hand_values():
    """seq_mean_k3 <= 0.01 with k3 = e^lr - 1 - lr; kl_level='token' and 'seq_max' as verl defines them."""
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    blp = [[-1.2, -1.0], [-1.1, -0.95]]  # lr = 0.2, 0 | 0.1, -0.05
    k3 = [[math.exp(0.2) - 1.2, 0.0], [math.exp(0.1) - 1.1, math.exp(-0.05) - 0.95]]
    _, _, m, tok = run("grpo_k3_mask", old, blp, [1.0, 1.0], old_logp=old)
    assert (k3[0][0] + k3[0][1]) / 2 > 0.01 >= (k3[1][0] + k3[1][1]) / 2
    assert tok.clipped.tolist() == [[True, True], [False, False]]
    assert float(m["kl_stat_mean"]) == pytest.approx((k3[0][0] + k3[0][1] + k3[1][0] + k3[1][1]) / 4)
    _, _, _, tok = run("grpo_k3_mask", old, blp, [1.0, 1.0], old_logp=old, kl_level="token")
    assert tok.clipped.tolist() == [[True, False], [False, False]]
    _, _, _, tok = run("grpo_k3_mask", old, blp, [1.0, 1.0], old_logp=old, kl_level="seq_max", kl_estimator="k2")
    assert tok.clipped.tolist() == [[True, True], [False, False]]  # max k2: 0.02 > 0.01 | 0.005


# ------------------------------------------------------------------------------------------ SAT on it
def test_sat_decoupled_ppo_is_decoupled_ppo_with_one_step_per_batch():
    """pi_theta == pi_prox: SAT's d = log(pi / pi_prox) is 0 everywhere, q = 0 and the gate is off."""
    logp, blp, mask, adv, _ = batch(4, spread=0.8)
    a = loss_grad("sat_decoupled_ppo", logp, blp, mask, adv, old_logp=logp)
    b = loss_grad("decoupled_ppo", logp, blp, mask, adv, old_logp=logp)
    assert float(a[2]["gate_rate"]) == 0.0 and float(a[2]["q"]) == 0.0
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_sat_decoupled_ppo_gates_the_proximal_ratio():
    """With pi moved from pi_prox (several steps per batch), SAT gates on |log pi / pi_prox| and changes the
    gradient only of gated tokens; the behaviour weight is decoupled PPO's."""
    logp, blp, mask, adv, _ = batch(5, spread=0.8)
    old = logp - 0.17 * (2 * torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=F64) - 1)
    a = loss_grad("sat_decoupled_ppo", logp, blp, mask, adv, old_logp=old)
    b = loss_grad("decoupled_ppo", logp, blp, mask, adv, old_logp=old)
    gate = a[3].gate
    assert gate.any() and float(a[2]["sat_clipfrac"]) > 0
    assert torch.equal(a[1][~gate], b[1][~gate]) and not torch.equal(a[1][gate], b[1][gate])
    assert torch.equal(a[2]["behav_imp_mean"], b[2]["behav_imp_mean"])
    c = loss_grad("sat_decoupled_ppo", logp, blp, mask, adv, old_logp=old, alpha=1.0)
    assert torch.equal(c[0], b[0]) and torch.equal(c[1], b[1])


# ---------------------------------------------------------------------------------------------- generic
def test_declared_needs():
    needs = {p: resolve_objective(p, kl_coef=0).needs for p in REPAIRS}
    assert needs == {"decoupled_ppo": {"old_logp"}, "sat_decoupled_ppo": {"old_logp"}, "a3po": {"lag"},
                     "topr": set(), "vespo": set(), "m2po_official": set(), "grpo_geo_mask": {"old_logp"},
                     "grpo_k3_mask": {"old_logp"}}  # fmt: skip


@pytest.mark.parametrize("preset", REPAIRS)
def test_garbage_in_masked_positions_and_lags_changes_nothing(preset):
    logp, blp, mask, adv, lag = batch(6, spread=0.5)
    mask[2] = False  # an empty response
    old = logp + 0.05
    clean = loss_grad(preset, logp, blp, mask, adv, old_logp=old, lag=lag)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30], dtype=F64)
    fill = junk[torch.arange(logp.numel()).reshape(logp.shape) % 4]
    dirty_lag = torch.where(mask, lag, torch.full_like(lag, -(2**40)))
    dirty = loss_grad(preset, torch.where(mask, logp, fill), torch.where(mask, blp, fill), mask, adv,
                      old_logp=torch.where(mask, old, fill), lag=dirty_lag)  # fmt: skip
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])
    assert torch.all(dirty[1][~mask] == 0) and torch.all(dirty[0][~mask] == 0)
    for key, value in clean[2].items():
        assert value.dim() == 0 and torch.isfinite(value), key
        assert torch.equal(value, dirty[2][key]), key


@pytest.mark.parametrize("preset", REPAIRS)
def test_no_host_sync(preset):
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(40, 10, generator=g) * 3).requires_grad_()
    blp = logp.detach() + 0.3 * torch.randn(40, 10, generator=g)
    mask, adv = torch.rand(40, 10, generator=g) > 0.2, torch.randn(40, generator=g)
    spec = resolve_objective(preset)
    rec = Recorder()
    with rec:
        out = spec(logp=logp, behavior_logp=blp, adv=adv, mask=mask, old_logp=blp + 0.01,
                   lag=torch.randint(0, 4, (40, 10), generator=g))  # fmt: skip
        aggregate(out.loss, mask, "token-mean").backward()
    assert rec.ops and not (rec.ops & SYNCING), sorted(rec.ops & SYNCING)
