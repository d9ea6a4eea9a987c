"""Bit-identity with the gate off, garbage padding, permutation, GSPO vs GRPO, zero advantage, errors."""

import pytest
import torch

from satrl.objectives import (
    aggregate,
    available_presets,
    policy_loss,
    resolve_objective,
    sat_clip_bounds,
)


def inputs(seed=0, B=6, T=9, spread=0.2, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 2 - 0.05
    blp = (logp + spread * torch.randn(B, T, generator=g, dtype=dtype)).clamp(max=-1e-3)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(B, generator=g, dtype=dtype)
    ref = logp + 0.1 * torch.randn(B, T, generator=g, dtype=dtype)
    return logp, blp, mask, adv, ref


def run(preset, logp, blp, mask, adv, ref=None, agg="token-mean", **kw):
    if "lag" not in kw and "lag" in resolve_objective(preset).needs:  # A-3PO reads the tokens' lags: 0..4,
        kw["lag"] = torch.nan_to_num(blp * 1e4).abs().long() % 5  # a function of the token (permutations move it)
    logp = logp.clone().requires_grad_()
    loss, m, tok = policy_loss(preset, logp=logp, behavior_logp=blp, adv=adv, mask=mask, ref_logp=ref, **kw)
    (g,) = torch.autograd.grad(aggregate(loss, mask, agg), logp)
    return loss.detach(), g, m, tok


@pytest.mark.parametrize("base", ["grpo", "gspo"])
@pytest.mark.parametrize("way", ["alpha=1", "all |d| equal", "q=0"])
def test_sat_gate_off_is_bit_identical_to_base(base, way):
    logp, blp, mask, adv, ref = inputs(B=30)  # one response is < 10% of the tokens (q = 0 case)
    kw = {}
    if way == "alpha=1":
        kw = {"alpha": 1.0}
    elif way == "all |d| equal":
        # exactly representable: blp on a 1/8 grid, d = +-0.25, one sign per response (GSPO's mean too)
        blp = -torch.randint(1, 24, logp.shape).float() / 8
        sign = torch.where(torch.rand(logp.shape[0], 1) > 0.5, 1.0, -1.0)
        logp = blp + 0.25 * sign
    else:  # 95% of |d| exactly 0 -> q = 0 although some tokens have large |d|
        blp = logp.clone()
        blp[0, 0] = logp[0, 0] - 0.7
    sat = run("sat_" + base, logp, blp, mask, adv, ref, **kw)
    b = run(base, logp, blp, mask, adv, ref)
    assert not sat[3].gate.any()
    assert torch.equal(sat[0], b[0]) and torch.equal(sat[1], b[1])
    for key in ("clipfrac", "clipfrac_high", "clipfrac_low", "ppo_kl", "logratio_var", "kl"):
        assert torch.equal(sat[2][key], b[2][key])
    assert torch.equal(sat[3].clipped, b[3].clipped) and torch.equal(sat[3].d, b[3].d)
    if way == "q=0":
        assert float(sat[2]["q"]) == 0.0 and float(sat[3].d.abs().max()) > 0


@pytest.mark.parametrize("preset", available_presets())
@pytest.mark.parametrize("adv_dim", [1, 2])
def test_padding_garbage_changes_nothing(preset, adv_dim):
    logp, blp, mask, adv, ref = inputs(1, spread=0.4)
    old = logp + 0.05
    if adv_dim == 2:
        adv = adv[:, None] * torch.linspace(0.5, 1.5, logp.shape[1])
    clean = run(preset, logp, blp, mask, adv, ref, old_logp=old)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])
    fill = junk[torch.arange(logp.numel()).reshape(logp.shape) % 4]
    dirty_args = [torch.where(mask, t, fill) for t in (logp, blp, ref, old)]
    dirty_adv = torch.where(mask, adv, fill) if adv_dim == 2 else adv
    dirty = run(preset, dirty_args[0], dirty_args[1], mask, dirty_adv, dirty_args[2], old_logp=dirty_args[3])
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1], dirty[1])
    assert torch.all(dirty[1][~mask] == 0) and torch.all(dirty[0][~mask] == 0)
    assert clean[2].keys() == dirty[2].keys()
    for key, value in clean[2].items():
        assert torch.equal(value, dirty[2][key]), key
    for field in ("d", "gate", "clipped"):
        assert torch.equal(getattr(clean[3], field), getattr(dirty[3], field)), field
    assert torch.all(dirty[3].d[~mask] == 0) and not (dirty[3].gate | dirty[3].clipped)[~mask].any()


def test_fully_masked_response_with_nan_advantage():
    logp, blp, mask, adv, _ = inputs(2)
    mask[3] = False
    adv[3] = float("nan")
    loss, g, m, _ = run("sat_grpo", logp, blp, mask, adv)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert all(torch.isfinite(v).all() for v in m.values() if v.dtype.is_floating_point)


@pytest.mark.parametrize("preset", available_presets())
def test_permuting_sequences_changes_nothing(preset):
    logp, blp, mask, adv, ref = inputs(3, spread=0.4)
    perm = torch.randperm(logp.shape[0], generator=torch.Generator().manual_seed(0))
    for agg in ("token-mean", "seq-mean-token-mean"):
        a = run(preset, logp, blp, mask, adv, ref, agg=agg)
        b = run(preset, logp[perm], blp[perm], mask[perm], adv[perm], ref[perm], agg=agg)
        # Not bit for bit: on some CPUs (seen: an AVX-512 Xeon, `sapo`'s sigmoid) an elementwise kernel rounds a
        # value differently in the vector body than in the scalar tail, so moving a row moves its last bit.
        torch.testing.assert_close(a[0][perm], b[0], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(a[1][perm], b[1], rtol=1e-6, atol=1e-9)
        for key in ("clipfrac", "q", "gate_rate", "ppo_kl", "logratio_var", "kl"):
            if key in a[2]:
                torch.testing.assert_close(a[2][key], b[2][key], rtol=1e-6, atol=1e-9)
        for field in ("d", "gate", "clipped"):
            torch.testing.assert_close(getattr(a[3], field)[perm], getattr(b[3], field), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("pair", [("gspo", "grpo"), ("sat_gspo", "sat_grpo"), ("gspo_tis", "grpo_tis")])
def test_gspo_on_one_token_responses_equals_grpo(pair):
    logp, blp, _, adv, ref = inputs(4, B=16, T=1, spread=0.5)
    mask = torch.ones_like(logp, dtype=torch.bool)
    a, b = (run(p, logp, blp, mask, adv, ref) for p in pair)
    torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-7)
    assert torch.equal(a[3].clipped, b[3].clipped) and torch.equal(a[3].gate, b[3].gate)


@pytest.mark.parametrize("preset", available_presets())
def test_zero_advantage_gives_zero_gradient(preset):
    logp, blp, mask, adv, _ = inputs(5, spread=0.5)
    loss, g, _, _ = run(preset, logp, blp, mask, torch.zeros_like(adv))
    assert torch.all(g == 0) and torch.all(loss == 0)


def test_gradient_flows_only_through_logp():
    logp, blp, mask, adv, ref = inputs(6)
    blp, adv, ref = (t.clone().requires_grad_() for t in (blp, adv, ref))
    loss, _, _ = policy_loss("sat_gspo_tis", logp=logp.requires_grad_(), behavior_logp=blp, adv=adv,
                          mask=mask, ref_logp=ref)
    grads = torch.autograd.grad(loss.sum(), (blp, adv, ref), allow_unused=True)
    assert all(g is None for g in grads)


def test_stale_tokens_do_not_overflow():
    logp, blp, mask, adv, _ = inputs(7)
    blp = blp.clone()
    blp[0, 0] = -1e4  # log-ratio 1e4: exp would overflow without the clamp
    loss, g, m, _ = run("sat_grpo", logp, blp, mask, adv)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()


def test_metric_keys_and_tok_tensors():
    logp, blp, mask, adv, ref = inputs(8)
    _, _, m, tok = run("sat_grpo_tis", logp, blp, mask, adv, ref)
    for key in ("clipfrac", "clipfrac_low", "clipfrac_high", "ppo_kl", "logratio_var", "q",
                "gate_rate", "eps_low_mean", "eps_high_mean", "c_min", "tis_mean", "tis_max",
                "tis_clipfrac", "kl"):
        assert m[key].dim() == 0 and not m[key].requires_grad, key
    # metrics hold only scalars; d_pi is the diagnostics' (mismatch/d_pi), not the objective's
    assert all(v.dim() == 0 for v in m.values()) and "d_pi" not in m
    assert tok.gate.dtype == torch.bool and tok.clipped.dtype == torch.bool
    assert tok.d.shape == tok.gate.shape == tok.clipped.shape == logp.shape
    assert not any(t.requires_grad for t in (tok.d, tok.gate, tok.clipped))
    torch.testing.assert_close(tok.d, torch.where(mask, logp - blp, 0.0))
    torch.testing.assert_close(m["ppo_kl"], -(logp - blp)[mask].mean())
    torch.testing.assert_close(m["logratio_var"], (logp - blp)[mask].var(unbiased=False), rtol=1e-4,
                               atol=1e-7)
    _, _, m, tok = run("grpo", logp, blp, mask, adv)
    assert not tok.gate.any() and "kl" not in m


def test_version_age_proxy_gates_the_oldest_tokens():
    logp, blp, mask, adv, _ = inputs(9, B=10, T=10)
    mask = torch.ones_like(mask)
    lag = torch.ones(10, 10, dtype=torch.long)
    lag[0] = 5  # the 10 tokens of response 0 are the stalest: exactly the top decile, q = 1
    _, _, m, tok = run("sat_grpo", logp, blp, mask, adv, lag=lag, proxy="version_age")
    assert torch.equal(tok.gate[0], (logp - blp)[0] != 0) and not tok.gate[1:].any()
    with pytest.raises(ValueError, match="lag="):
        run("sat_grpo", logp, blp, mask, adv, proxy="version_age")
    # the old keyword versions= (Batch.versions, the sample versions) is no objective key: an error listing them
    with pytest.raises(ValueError, match="'versions'.*valid keys.*proxy"):
        run("sat_grpo", logp, blp, mask, adv, versions=lag, proxy="version_age")


def test_prob_diff_proxy_uses_its_own_quantile():
    d = torch.tensor([[0.5, -0.5, 0.01, 0.02]])
    score = torch.tensor([[0.0, 0.3, 0.1, 0.2]])
    lo, hi, m, gate = sat_clip_bounds(d, torch.ones_like(d, dtype=torch.bool), alpha=0.75, score=score)
    assert gate.tolist() == [[False, True, False, False]]  # q = 0.2 (3rd smallest score)
    assert float(lo[0, 1]) == pytest.approx(1 - 0.2 / (1 + 1.5**2)) and float(hi[0, 1]) == pytest.approx(1.2)


@pytest.mark.parametrize("call, valid", [
    (lambda: resolve_objective("ppo2"), "sat_grpo"),
    (lambda: resolve_objective("grpo", alpha=0.9), "eps_high"),
    (lambda: resolve_objective("sat_grpo", proxy="entropy"), "version_age"),
    (lambda: resolve_objective("grpo", trust_region="trpo"), "dppo_tv"),
    (lambda: resolve_objective("grpo", correction="rs"), "icepop"),
    (lambda: resolve_objective("grpo", kl="k4"), "k3"),
    (lambda: resolve_objective("grpo", ratio="step"), "sequence"),
    (lambda: resolve_objective("grpo_tis", correction_level="batch"), "sequence"),
    (lambda: aggregate(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "mean"), "seq-mean-token-sum-norm"),
])
def test_registry_errors_name_valid_choices(call, valid):
    with pytest.raises(ValueError, match=valid):
        call()


def test_resolve_validates_values_and_overrides_compose():
    with pytest.raises(ValueError, match="alpha"):
        resolve_objective("sat_grpo", alpha=1.5)
    with pytest.raises(ValueError, match="dual_clip"):
        resolve_objective("grpo", dual_clip=0.5)
    spec = resolve_objective("grpo", trust_region="sat", correction="tis", alpha=0.8, tis_cap=3.0)
    assert (spec.trust_region.name, spec.correction.name, spec.trust_region.alpha, spec.correction.tis_cap) == (
        "sat", "tis", 0.8, 3.0)
    assert spec.trust_region.exponent == 2.0 and spec.trust_region.eps_high == 0.2  # the rest: sat's defaults
    assert resolve_objective("gspo").trust_region.eps_low == 0.2
    # a spec resolves again with more overrides; choosing a component by name resets its hyperparameters
    again = resolve_objective(spec, kl_coef=0.0)
    assert (again.trust_region.alpha, again.correction.tis_cap, again.kl.coef) == (0.8, 3.0, 0.0)
    assert resolve_objective(spec, trust_region="ppo").trust_region.name == "ppo"
    # GSPO's sequence-mean KL is chosen by the ratio component's declared trait, not by its name
    from satrl.objectives import RATIO_LEVELS

    assert RATIO_LEVELS.get("sequence").traits["per_sequence"] is True
    assert RATIO_LEVELS.get("token").traits["per_sequence"] is False
