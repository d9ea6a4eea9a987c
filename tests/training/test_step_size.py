"""The step-size seam (satrl.objectives.step_size), VCPO (satrl.objectives.vcpo) and train.lr_lag_scaling: hand-derived
ESS, scales and OPOB advantages; the lr is base * scale during opt.step() and the base lr after it (and in the
optimizer's state dict); the options off leave the trainer's step bit for bit as it was."""

import copy
import math

import pytest
import torch
from test_trainer import make_batch

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import resolve_objective
from satrl.objectives.step_size import StepInputs, StepSize, advantage_rule, lag_step_scale, step_size_rules
from satrl.objectives.vcpo import effective_sample_size, ess_step_scale, opob_advantages, sequence_log_weights
from satrl.training.advantages import group_advantages
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer

LN2 = math.log(2.0)
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def trainer(model, name="grpo", lr=1e-2, **kw):
    return Trainer(copy.deepcopy(model), resolve_objective(name, **kw.pop("obj", {})), TrainerSettings(lr=lr, **kw))


def weights_equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


# -- the pure functions, by hand ---------------------------------------------------------------------
def ess_case():
    """Four responses with sequence weights w = 1, 1, 2, 1/2 (d split over tokens; masked positions hold junk)
    and a fifth row with no active token: (sum w)^2 / sum w^2 = 4.5^2 / 6.25 = 3.24, ESS/B = 3.24 / 4 = 0.81."""
    nan = float("nan")
    d = torch.tensor([[0.0, 0.0, nan], [0.3, -0.3, 5.0], [LN2 / 2, LN2 / 2, nan], [-LN2, 0.0, 0.0], [nan, nan, nan]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    return d, mask


def test_sequence_weights_and_ess_by_hand():
    d, mask = ess_case()
    log_w = sequence_log_weights(d, mask)
    torch.testing.assert_close(log_w[:4].exp(), torch.tensor([1.0, 1.0, 2.0, 0.5], dtype=torch.float64))
    assert float(effective_sample_size(log_w, mask.any(1))) == pytest.approx(3.24, rel=1e-7)
    assert float(effective_sample_size(torch.zeros(7), torch.ones(7, dtype=torch.bool))) == pytest.approx(7.0)
    one = torch.tensor([0.0, 50.0, 0.0])  # one weight e^50 times the others: ESS -> 1
    assert float(effective_sample_size(one, torch.ones(3, dtype=torch.bool))) == pytest.approx(1.0, abs=1e-12)
    big = torch.tensor([900.0, 900.0 + LN2], dtype=torch.float64)  # w = e^900 overflows float64; the log-space form does not
    assert float(effective_sample_size(big, torch.ones(2, dtype=torch.bool))) == pytest.approx(9 / 5)


def test_ess_step_scale_by_hand():
    d, mask = ess_case()
    s, m = ess_step_scale(d, mask)
    assert float(m["ess"]) == pytest.approx(3.24) and float(m["ess_ratio"]) == pytest.approx(0.81)
    assert float(s) == pytest.approx(0.9)  # sqrt(0.81): VCPO's rule
    assert float(ess_step_scale(d, mask, ess_rule="linear")[0]) == pytest.approx(0.81)
    assert float(ess_step_scale(d, mask, ess_base_ratio=0.9)[0]) == pytest.approx(math.sqrt(0.9))
    assert float(ess_step_scale(d, mask, ess_base_ratio=0.5)[0]) == 1.0  # ESS/B above the base ratio: unscaled
    # capped at C = 1.5: w = 1, 1, 1.5, 0.5 -> 4^2 / 4.5
    capped = ess_step_scale(d, mask, ess_weight_cap=1.5)
    assert float(capped.metrics["ess"]) == pytest.approx(16 / 4.5)
    assert float(ess_step_scale(d, torch.zeros_like(mask))[0]) == 1.0  # nothing active: no opinion


def test_lag_step_scale_by_hand():
    lag = torch.tensor([[0, 2, 100], [4, 4, 100]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)  # active lags 0, 2, 4, 4: S = 2.5
    s, S = lag_step_scale(lag, mask, "inverse")
    assert (float(S), float(s)) == (2.5, 0.4)
    assert float(lag_step_scale(lag, mask, "inverse_sqrt")[0]) == pytest.approx(1 / math.sqrt(2.5))
    for sync in (torch.zeros_like(lag), torch.ones_like(lag)):  # lag 0 and lag 1: S clamps to 1, lr kept
        assert [float(x) for x in lag_step_scale(sync, mask, "inverse_sqrt")] == [1.0, 1.0]


def test_opob_advantages_by_hand():
    # group 0: R = 1, 0, 0 with w = 2, 1, 1 and equal score norms: W = 4, 1, 1, b = 4/6;
    # group 1: all rewards equal: A = 0 exactly, whatever W; group 2: every W = 0 (0/0): the group mean.
    R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    log_w = torch.tensor([LN2, 0.0, 0.0, 3.0, -1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    sq = torch.tensor([1.0, 1.0, 1.0, 2.0, 7.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    adv, m = opob_advantages(R, g, log_w, sq, std_norm=False)
    torch.testing.assert_close(adv[:3], torch.tensor([1 / 3, -2 / 3, -2 / 3]))
    assert torch.equal(adv[3:6], torch.zeros(3))
    torch.testing.assert_close(adv[6:], torch.tensor([-0.5, 0.5]))
    # |b_g - mean_g R| per response: 1/3 for group 0's three, 0 for the others
    assert float(m["opob_shift"]) == pytest.approx((3 * (2 / 3 - 1 / 3)) / 8)
    assert float(m["opob_shift_signed"]) == pytest.approx((3 * (2 / 3 - 1 / 3)) / 8)  # group 0's moved up
    _, m_down = opob_advantages(1 - R, g, log_w, sq, std_norm=False)  # rewards flipped: the baseline moves down
    assert float(m_down["opob_shift_signed"]) == pytest.approx(-(3 * (2 / 3 - 1 / 3)) / 8)
    normed, _ = opob_advantages(R, g, log_w, sq, std_norm=True)
    sigma0 = math.sqrt(2 / 9)  # population std of 1, 0, 0
    torch.testing.assert_close(normed[:3], torch.tensor([1 / 3, -2 / 3, -2 / 3]) / (sigma0 + 1e-6))


def test_opob_with_equal_weights_is_grpo():
    gen = torch.Generator().manual_seed(0)
    R = (torch.rand(24, generator=gen) > 0.5).float()
    g = torch.arange(24) // 6
    for std_norm in (True, False):
        adv, m = opob_advantages(R, g, torch.zeros(24), torch.full((24,), 3.0), std_norm)
        torch.testing.assert_close(adv, group_advantages(R, g, std_norm), rtol=0, atol=1e-6)
        assert float(m["opob_shift"]) < 1e-12


# -- the seam: what the objective declares -------------------------------------------------------------
def test_only_vcpo_declares_a_step_size_and_its_baseline_is_switchable():
    assert step_size_rules(resolve_objective("grpo")) == [] and advantage_rule(resolve_objective("grpo")) is None
    vcpo = resolve_objective("vcpo")
    assert (vcpo.ratio.name, vcpo.trust_region.name, vcpo.correction.name) == ("token", "ppo", "vcpo")
    assert len(step_size_rules(vcpo)) == 1 and advantage_rule(vcpo) is opob_advantages
    assert advantage_rule(resolve_objective("vcpo", baseline="group_mean")) is None
    d, mask = ess_case()
    (rule,) = step_size_rules(resolve_objective("vcpo", ess_rule="linear"))
    assert float(rule(StepInputs(d, mask, torch.zeros_like(mask, dtype=torch.long))).scale) == pytest.approx(0.81)


def test_vcpo_changes_no_token_loss():
    """The correction's weight is 1: vcpo's per-token loss and gradient are GRPO's."""
    from satrl.objectives import policy_loss

    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 5, generator=g) - 0.1
    blp = logp + 0.3 * torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.2
    outs = []
    for name in ("grpo", "vcpo"):
        lp = logp.clone().requires_grad_()
        loss = policy_loss(name, logp=lp, behavior_logp=blp, adv=torch.tensor([1.0, -0.5, 2.0]), mask=mask).loss
        outs.append((loss, torch.autograd.grad(loss.sum(), lp)[0]))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


# -- the trainer applies it ----------------------------------------------------------------------------
def record_lr(t):
    """Patch ``t.opt.step`` to record every param group's lr at the moment the optimizer steps."""
    seen, step = [], t.opt.step

    def spy(*a, **k):
        seen.append([g["lr"] for g in t.opt.param_groups])
        return step(*a, **k)

    t.opt.step = spy
    return seen


def test_vcpo_step_uses_base_lr_times_the_ess_scale_and_restores_it(tiny):
    model, tok = tiny
    batch = make_batch(tok)
    t = trainer(model, "vcpo")
    seen = record_lr(t)
    d = torch.where(batch.mask, t.logp_with(None, batch) - batch.behavior_logp, 0.0)  # the weights the step sees
    log_w = d.double().sum(1)
    want = float(((2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0)).exp() / 6).sqrt())
    out = t.step(batch, ADV)
    assert out["obj/step_scale"] == pytest.approx(want, rel=1e-6) and want < 0.99  # the rule acted
    assert out["train/lr_scale"] == out["obj/step_scale"] and out["obj/ess_ratio"] == pytest.approx(want**2, rel=1e-6)
    assert seen == [[1e-2 * out["train/lr_scale"]]]  # during the step
    assert t.opt.param_groups[0]["lr"] == 1e-2  # after it, and in what a checkpoint saves
    assert t.state_dict()["opt"]["param_groups"][0]["lr"] == 1e-2
    # the same step as a plain GRPO trainer whose lr is base * scale: bit for bit (vcpo's loss is GRPO's)
    ref = trainer(model, "grpo", lr=1e-2 * out["train/lr_scale"])
    ref.step(batch, ADV)
    assert weights_equal(t, ref)


@pytest.mark.parametrize("rule, factor", [("inverse", 1 / 4), ("inverse_sqrt", 1 / 2)])
def test_lag_scaling_on_a_batch_at_lag_4(tiny, rule, factor):
    model, tok = tiny
    batch = make_batch(tok, version=0)
    t, ref = trainer(model, lr_lag_scaling=rule), trainer(model, lr=1e-2 * factor)
    t.version = ref.version = 4  # every token 4 steps stale
    seen = record_lr(t)
    out = t.step(batch, ADV)
    assert (out["train/lr_lag"], out["train/lag_lr_scale"], out["train/lr_scale"]) == (4.0, factor, factor)
    assert seen == [[1e-2 * factor]] and t.opt.param_groups[0]["lr"] == 1e-2
    ref.step(batch, ADV)
    assert weights_equal(t, ref)


def test_lag_scaling_composes_with_vcpo(tiny):
    model, tok = tiny
    batch = make_batch(tok, version=0)
    t = trainer(model, "vcpo", lr_lag_scaling="inverse")
    t.version = 2
    out = t.step(batch, ADV)
    assert out["train/lr_scale"] == pytest.approx(out["obj/step_scale"] * 0.5, rel=1e-12)


def test_options_off_leave_the_step_bit_for_bit(tiny):
    """lr_lag_scaling=none and an objective without a rule: the lr is never written, no metric is added, and the
    weights after two steps equal a trainer built without the option; vcpo's baseline=group_mean keeps GRPO's
    advantages."""
    model, tok = tiny
    batch = make_batch(tok, version=0)
    plain, off = trainer(model), trainer(model, lr_lag_scaling="none")
    assert not plain.scales_lr and not off.scales_lr and off.advantages.baseline is None
    writes = []

    class Watch(dict):
        def __setitem__(self, k, v):
            writes.append(k)
            super().__setitem__(k, v)

    off.opt.param_groups[0] = Watch(off.opt.param_groups[0])
    outs = []
    with pytest.MonkeyPatch.context() as patch:  # neither trainer scales: no rule may run
        patch.setattr("satrl.training.trainer.step_scales", lambda *a: pytest.fail("a step-size rule ran, options off"))
        for t in (plain, off):
            t.version = 3
            outs.append([t.step(batch, ADV), t.step(batch, ADV)])
    assert weights_equal(plain, off) and "lr" not in writes
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731  (NaN: undefined on both)
    assert all(a.keys() == b.keys() and all(same(a[k], b[k]) for k in a) for a, b in zip(*outs))
    assert not any(k.startswith("train/l") or k == "obj/step_scale" for k in outs[1][0])


def test_a_non_finite_scale_skips_the_step_and_keeps_the_lr(tiny):
    model, tok = tiny
    batch = make_batch(tok)
    t = trainer(model, "vcpo")
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    t.step_rules = [lambda inp: StepSize(torch.tensor(float("nan"), dtype=torch.float64), {})]
    out = t.step(batch, ADV)
    assert out["skipped"] == 1.0 and t.opt.param_groups[0]["lr"] == 1e-2
    assert all(torch.equal(v, before[k]) for k, v in t.model.state_dict().items())


def test_sequence_scores_are_each_rows_weight_and_score_norm(tiny):
    from satrl.training.microbatches import Micro, row_slice

    model, tok = tiny
    batch = make_batch(tok)
    t = trainer(model, "vcpo")
    log_w, sq = t.advantages.sequence_scores(batch)
    logp = t.logp_with(None, batch)
    torch.testing.assert_close(log_w, torch.where(batch.mask, logp - batch.behavior_logp, 0.0).double().sum(1))
    for i in (0, 4):  # the squared norm of the gradient of sum_t log pi, by a plain backward of that row alone
        t.model.zero_grad(set_to_none=True)
        row = row_slice(batch, i, i + 1)
        lp = t.scorer.logp(t.model, row, Micro(i, i + 1, int(row.attention_mask.sum()), False, row.mask.shape[1]))[0]
        torch.where(row.mask, lp, 0.0).sum().backward()
        want = sum(float(p.grad.double().square().sum()) for p in t.model.parameters() if p.grad is not None)
        assert float(sq[i]) == pytest.approx(want, rel=1e-5)
    t.model.zero_grad(set_to_none=True)


def test_train_batch_steps_on_the_opob_advantages(tiny, monkeypatch):
    model, tok = tiny
    batch = make_batch(tok)
    batch.rewards[:] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])  # groups g0 (rows 0-2) and g1 (rows 3-5)
    t = trainer(model, "vcpo")
    log_w, sq = t.advantages.sequence_scores(batch)
    want, stats = opob_advantages(batch.rewards, batch.group_index, log_w, sq)
    got = []
    monkeypatch.setattr(t, "step", lambda mb, adv, *a: got.append((mb.sample_ids, adv)) or {})
    (metrics, rows), = list(t.train_batch(batch, 0, lambda v: None, stop_at=1))
    ids, adv = got[0]
    assert torch.equal(adv, want[rows]) and metrics == {f"obj/{k}": float(v) for k, v in stats.items()}
    assert set(metrics) == {"obj/opob_shift", "obj/opob_shift_signed"}
    assert not torch.allclose(want, group_advantages(batch.rewards, batch.group_index))  # OPOB moved the baseline
    t.advantages.baseline = None  # vcpo with baseline=group_mean: GRPO's advantages
    got.clear()
    list(t.train_batch(batch, 0, lambda v: None, stop_at=1))
    assert torch.equal(got[0][1], group_advantages(batch.rewards, batch.group_index)[rows])


def test_data_parallel_accepts_every_vcpo_baseline():
    """Issue 45: data parallel no longer refuses the per-sequence baseline (its equality with one device is
    tests/training/test_dp_trainer.py::test_vcpo_baseline_equals_one_device)."""
    from satrl.config import load_config
    from satrl.launch.data_parallel import check_supported

    for baseline in ("group_mean", "opob", "opob_unweighted"):
        check_supported(load_config(None, ["objective.name=vcpo", f"objective.baseline={baseline}"]))
    check_supported(load_config(None, ["train.lr_lag_scaling=inverse"]))


def test_vcpos_two_controls_are_independent_switches(tiny):
    """ess_step=false leaves no step rule (the base lr); baseline=opob_unweighted is OPOB with every w_i = 1;
    both are saved resolved in the objective's config."""
    from satrl.config import load_config
    from satrl.objectives.vcpo import opob_unweighted_advantages

    off = resolve_objective("vcpo", ess_step=False)
    assert step_size_rules(off) == [] and advantage_rule(off) is opob_advantages
    unweighted = resolve_objective("vcpo", baseline="opob_unweighted", ess_step=False)
    assert advantage_rule(unweighted) is opob_unweighted_advantages and step_size_rules(unweighted) == []
    assert len(step_size_rules(resolve_objective("vcpo", baseline="group_mean"))) == 1
    R = torch.tensor([1.0, 0.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 0])
    log_w = torch.tensor([3.0, 0.0, 0.0, -2.0], dtype=torch.float64)
    sq = torch.tensor([1.0, 4.0, 1.0, 2.0], dtype=torch.float64)
    got, _ = opob_unweighted_advantages(R, g, log_w, sq, std_norm=False)
    b = (1 * 1 + 2 * 1) / (1 + 4 + 1 + 2)  # sum ||g||^2 R / sum ||g||^2, the weights ignored
    torch.testing.assert_close(got, R - b)
    assert not torch.allclose(got, opob_advantages(R, g, log_w, sq, std_norm=False)[0])
    cfg = load_config(None, ["objective.name=vcpo", "objective.ess_step=false", "objective.baseline=opob_unweighted"])
    dumped = cfg.objective.model_dump()
    assert "ess_step" in str(dumped) and "opob_unweighted" in str(dumped)
