"""VCPO in TRL (``satrl.integrations.trl_vcpo``) through TRL's real ``GRPOTrainer`` loop, on CPU.

A tiny Qwen3 from satrl's builders and the char tokenizer, saved to a temporary directory (no hub). Stale log-probs
come from a ``rollout_func`` that returns random completions with the policy's own log-probs plus noise (as an
engine whose kernels or weights lag). Without TRL these tests skip with the reason printed; ``make test`` sets
``SATRL_REQUIRE_TRL=1``, and ``tests/integrations/test_trl.py::test_trl_is_installed_when_required`` then fails.
"""

from __future__ import annotations

import pytest
import torch

from run_helpers import Extra
from satrl.models import build_char_tokenizer
from satrl.objectives.vcpo import ess_step_scale, opob_advantages

with Extra("TRL") as trl_extra:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd

    from satrl.integrations import trl_baselines, trl_vcpo
    from satrl.integrations.trl_vcpo import VCPOGRPOConfig, VCPOGRPOTrainer
TRL_MISSING = trl_extra.missing


pytestmark = pytest.mark.skipif(TRL_MISSING is not None, reason=str(TRL_MISSING))
PROMPTS = ["1+1=", "2+3=", "7-4=", "3*3=", "8/2=", "5+5=", "9-1=", "6*2="]
OURS = ("obj/", "train/lr_scale", "vcpo/")  # the keys VCPO adds to TRL's logs


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that rollout_func is experimental


import test_trl  # noqa: E402  (the same tiny policy fixture and reward as SAT's TRL tests)

tiny_dir, reward_digits = test_trl.tiny_dir, test_trl.reward_digits


def config(cls, out, **kw):
    base = dict(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=3, num_iterations=2, learning_rate=3e-5, logging_steps=1, report_to="none", save_strategy="no",
        seed=0, loss_type="grpo", dataloader_num_workers=0, disable_tqdm=True,
    )
    return cls(**{**base, **kw})


def trainer(cls, cfg_cls, tiny_dir, out, rollout_func=None, **kw):
    extra = {} if rollout_func is None else {"rollout_func": rollout_func}
    return cls(model=tiny_dir, reward_funcs=reward_digits, args=config(cfg_cls, out, **kw),
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_char_tokenizer(), **extra)


def stale_rollout(noise: float = 0.3):
    """A rollout_func: random completions (3 to 8 tokens) scored by the policy itself, plus token noise."""
    calls = [0]

    def rollout(prompts, tr):
        g = torch.Generator().manual_seed(1000 + calls[0])
        calls[0] += 1
        pids = [tr.processing_class(p)["input_ids"] for p in prompts]
        cids = [torch.randint(4, 40, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
                for _ in prompts]
        lps = []
        with torch.no_grad():
            for p, c in zip(pids, cids):
                logits = tr.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1]
                lp = torch.log_softmax(logits.float() / tr.temperature, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
                lps.append((lp + noise * torch.randn(len(c), generator=g)).tolist())
        return {"prompt_ids": pids, "completion_ids": cids, "logprobs": lps}

    return rollout


def trl_logp(tr, ids, attn, k):
    """TRL's own log-probs (the base class's method: no VCPO hook), fused LM head included."""
    return GRPOTrainer._get_per_token_logps_and_entropies(tr, tr.model, ids, attn, k)[0]


_REFERENCE: dict = {}  # each module that imports the fixture has its own copy of it: one run for all


@pytest.fixture(scope="session")
def grpo_reference(tiny_dir, tmp_path_factory):
    """(logs, final weights) of GRPOTrainer's 3 steps at this file's ``config``: trained once per test process and
    read by every exact comparison against it (test_trl_baselines.py's too, whose settings are these)."""
    if tiny_dir not in _REFERENCE:
        torch.set_num_threads(1)  # as every test here (a session fixture is made before the autouse one runs)
        out = tmp_path_factory.mktemp("grpo-reference")
        _REFERENCE[tiny_dir] = train(trainer(GRPOTrainer, GRPOConfig, tiny_dir, out))
    return _REFERENCE[tiny_dir]


def untimed(h):
    return {k: v for k, v in h.items() if not k.startswith(OURS) and "time" not in k and "per_second" not in k}


def train(tr):
    tr.train()
    return [h for h in tr.state.log_history if "loss" in h], [p.detach().clone() for p in tr.model.parameters()]


# -- (i) uniform baseline, step scale 1: TRL's GRPOTrainer bit for bit ------------------------------------------
@pytest.mark.parametrize("case", ["group_mean", "opob_zero_shift", "ess_step_off"])
def test_unit_scale_and_group_baseline_train_exactly_as_grpo(tiny_dir, tmp_path, monkeypatch, case, grpo_reference):
    """3 steps, 2 iterations per batch (so pi_theta != mu at the second): with the ESS scale forced to 1 (base
    ratio below 1/B, or ``vcpo_ess_step=False`` at base ratio 1, where the ESS ratio falls below 1) and the
    baseline the group mean (``group_mean``; or ``opob`` with its shift forced to 0, so the score pass and satrl's
    recomputation of TRL's centring and scaling both run), the logs and final weights equal GRPOTrainer's
    exactly."""
    ref_logs, ref_params = grpo_reference
    kw = {"group_mean": dict(vcpo_ess_base_ratio=1e-9, vcpo_baseline="group_mean"),
          "opob_zero_shift": dict(vcpo_ess_base_ratio=1e-9, vcpo_baseline="opob"),
          "ess_step_off": dict(vcpo_ess_step=False, vcpo_baseline="group_mean")}[case]
    if case == "opob_zero_shift":
        monkeypatch.setattr(trl_vcpo, "opob_shift", lambda rewards, group, log_w, sq: torch.zeros_like(log_w))
    logs, params = train(trainer(VCPOGRPOTrainer, VCPOGRPOConfig, tiny_dir, tmp_path, **kw))
    assert len(ref_logs) == 3 and all(h["train/lr_scale"] == 1.0 for h in logs)
    assert all(0 < h["obj/ess_ratio"] <= 1 + 1e-12 for h in logs)
    if case == "opob_zero_shift":
        assert [h["obj/opob_shift"] for h in logs if "obj/opob_shift" in h] == [0.0, 0.0]  # two generations
    if case == "ess_step_off":
        assert min(h["obj/ess_ratio"] for h in logs) < 1 - 1e-9  # the rule, on, would have scaled the lr
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert [untimed(h) for h in logs] == [untimed(h) for h in ref_logs]


def test_stale_rollouts_change_the_update(tiny_dir, tmp_path):
    """The same data with stale log-probs and VCPO's defaults: the lr is scaled below 1, the baseline moves, and the
    weights differ from GRPOTrainer's on that data (the comparison above can fail)."""
    _, ref_params = train(trainer(GRPOTrainer, GRPOConfig, tiny_dir, tmp_path / "a", rollout_func=stale_rollout()))
    logs, params = train(trainer(VCPOGRPOTrainer, VCPOGRPOConfig, tiny_dir, tmp_path / "b",
                                 rollout_func=stale_rollout()))
    assert all(h["train/lr_scale"] < 1 and h["vcpo/mu_source"] == 1.0 for h in logs)
    assert max(h.get("obj/opob_shift", 0.0) for h in logs) > 0.01
    assert not all(torch.equal(a, b) for a, b in zip(params, ref_params))


# -- (ii) the shift b_g equals satrl's opob_advantages on the same batch ------------------------------------------
@pytest.mark.parametrize("scale_rewards,baseline", [("group", "opob"), ("batch", "opob"), ("none", "opob"),
                                                    ("group", "opob_unweighted")])
def test_opob_shift_equals_satrl_on_a_stale_batch(tiny_dir, tmp_path, scale_rewards, baseline):
    """One generation of stale completions. Independently of the plug-in: log w_i from the batch's old and
    sampling log-probs, ||grad log pi(tau_i)||^2 by one backward per row through TRL's own (fused) log-prob path,
    then satrl's ``opob_advantages`` (R - b_g) under TRL's scaling. The plug-in's score norms, log w and final
    advantages equal those; the advantages differ from GRPO's; ``obj/opob_shift`` is satrl's metric. In fp32
    (``bf16=False``; TRL's default autocasts to bf16 on CPU too, where the fused and unfused paths round apart by
    about 0.5 %), so the score norms agree within 1e-5. ``opob_unweighted``: the same with every log w_i = 0."""
    tr = trainer(VCPOGRPOTrainer, VCPOGRPOConfig, tiny_dir, tmp_path, rollout_func=stale_rollout(),
                 max_steps=1, scale_rewards=scale_rewards, vcpo_baseline=baseline, bf16=False)  # fp32
    seen: dict = {}
    scores, rewards, generate = tr._vcpo_sequence_scores, tr._calculate_rewards, tr._generate_and_score_completions

    def spy_scores(out):
        log_w, sq = scores(out)
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        mask, k = out["completion_mask"].bool(), out["completion_ids"].size(1)
        params = [p for p in tr.model.parameters() if p.requires_grad]
        ref_sq = []
        with torch.enable_grad():  # the per-row reference at pi_old (no step has been taken)
            for i in range(ids.size(0)):
                lp = trl_logp(tr, ids[i:i + 1], attn[i:i + 1], k)
                grads = torch.autograd.grad(torch.where(mask[i:i + 1], lp, 0.0).sum(), params)
                ref_sq.append(sum(g.double().square().sum() for g in grads))
        d = (out["old_per_token_logps"] - out["sampling_per_token_logps"]).double()
        seen.update(log_w=log_w, sq=sq, ref_sq=torch.stack(ref_sq), ref_log_w=torch.where(mask, d, 0.0).sum(1))
        return log_w, sq

    def spy_rewards(*args, **kwargs):
        seen["rewards_per_func"] = rewards(*args, **kwargs)
        return seen["rewards_per_func"]

    def spy_generate(inputs):
        seen["out"] = generate(inputs)
        return seen["out"]

    tr._vcpo_sequence_scores, tr._calculate_rewards, tr._generate_and_score_completions = (
        spy_scores, spy_rewards, spy_generate)
    logs, _ = train(tr)
    torch.testing.assert_close(seen["sq"], seen["ref_sq"], rtol=1e-5, atol=0.0)
    torch.testing.assert_close(seen["log_w"], seen["ref_log_w"], rtol=1e-12, atol=1e-12)
    assert float(seen["ref_log_w"].std()) > 0.1  # stale: the weights are far from uniform
    R = seen["rewards_per_func"][:, 0]
    group = torch.arange(R.numel()) // tr.num_generations
    log_w = seen["ref_log_w"] if baseline == "opob" else torch.zeros_like(seen["ref_log_w"])
    want, m = opob_advantages(R.double(), group, log_w, seen["ref_sq"], std_norm=False)  # R - b_g
    centred = R - R.view(-1, tr.num_generations).mean(1).repeat_interleave(tr.num_generations)
    if scale_rewards == "group":
        std = nanstd(R.view(-1, tr.num_generations), dim=1).repeat_interleave(tr.num_generations)
    else:
        std = nanstd(R).expand_as(R)
    scaled = (lambda x: x) if scale_rewards == "none" else (lambda x: x / (std.double() + 1e-4))
    got = seen["out"]["advantages"]
    torch.testing.assert_close(got.double(), scaled(want), rtol=1e-5, atol=1e-5)
    assert float((got.double() - scaled(centred.double())).abs().max()) > 1e-2  # not GRPO's advantages
    assert logs[0]["obj/opob_shift"] == pytest.approx(float(m["opob_shift"]), rel=1e-4)
    assert float(m["opob_shift"]) > 1e-2


# -- (iii) the lr: scaled inside the step, restored after --------------------------------------------------------
class LRWatch(TrainerCallback):
    """The lr of each param group as the step begins, inside ``optimizer.step()`` (a torch pre-hook) and after."""

    def __init__(self):
        self.base, self.inside, self.after = [], [], []

    def on_train_begin(self, args, state, control, optimizer=None, **kw):
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.register_step_pre_hook(lambda opt, *a: self.inside.append([g["lr"] for g in opt.param_groups]))

    def on_step_begin(self, args, state, control, optimizer=None, **kw):
        self.base.append([g["lr"] for g in optimizer.param_groups])

    def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
        self.after.append([g["lr"] for g in optimizer.param_groups])


@pytest.mark.parametrize("rule,accumulation", [("sqrt", 1), ("linear", 1), ("sqrt", 2)])
def test_lr_is_scaled_for_the_step_and_restored(tiny_dir, tmp_path, rule, accumulation):
    """Stale rollouts: inside each optimizer.step() every param group's lr is the base lr times the ESS scale of
    that step's completions (all loss calls of its gradient-accumulation window), computed here from TRL's
    log-probs at each loss forward and the sampling log-probs (``ess_step_scale``); after the step it is the base
    lr again (so the scheduler and the state dict never see the scale), and ``train/lr_scale`` logs the scale."""
    tr = trainer(VCPOGRPOTrainer, VCPOGRPOConfig, tiny_dir, tmp_path, rollout_func=stale_rollout(),
                 vcpo_baseline="group_mean", vcpo_ess_rule=rule, gradient_accumulation_steps=accumulation,
                 per_device_train_batch_size=8 // accumulation)
    watch, calls = LRWatch(), []
    tr.add_callback(watch)
    loss = tr._compute_loss

    def spy_loss(model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            logp = trl_logp(tr, ids, attn, inputs["completion_ids"].size(1))
        sampling = inputs["sampling_per_token_logps"]
        mu = torch.where(torch.isfinite(sampling), sampling, inputs["old_per_token_logps"])
        calls.append((logp - mu, inputs["completion_mask"].bool()))
        return loss(model, inputs)

    tr._compute_loss = spy_loss
    logs, _ = train(tr)
    assert len(calls) == 3 * accumulation and len(watch.inside) == len(watch.after) == 3
    expected = []
    for k in range(0, len(calls), accumulation):  # one optimizer step: the window's loss calls, rows stacked
        window = calls[k:k + accumulation]
        assert len({d.shape for d, _ in window}) == 1  # one generation batch, one padded width
        d, mask = torch.cat([d for d, _ in window]), torch.cat([m for _, m in window])
        expected.append(float(ess_step_scale(d, mask, ess_rule=rule).scale))
    for s, base, inside, after, h in zip(expected, watch.base, watch.inside, watch.after, logs):
        assert 0 < s < 0.99
        assert inside == pytest.approx([lr * s for lr in base], rel=1e-9)
        assert after == base  # restored exactly
        assert h["train/lr_scale"] == pytest.approx(s, rel=1e-9)
    assert [g["lr"] for g in tr.optimizer.state_dict()["param_groups"]] == tr.lr_scheduler.get_last_lr()  # unscaled


def test_a_trl_whose_advantages_differ_is_refused(tiny_dir, tmp_path, monkeypatch):
    """If TRL's centring or epsilon changed, the OPOB shift would land in the wrong formula: the trainer checks its
    recomputation against TRL's own advantages and raises."""
    monkeypatch.setattr(trl_baselines, "TRL_ADV_EPS", 1e-3)  # shared by both plug-ins
    tr = trainer(VCPOGRPOTrainer, VCPOGRPOConfig, tiny_dir, tmp_path, max_steps=1)
    with pytest.raises(RuntimeError, match="not supported by satrl.integrations.trl_vcpo"):
        tr.train()


# -- (iv) configuration ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keys,match", [
    ({"vcpo_ess_rule": "cube"}, r"VCPOGRPOConfig.vcpo_ess_rule: got 'cube'; Input should be 'sqrt' or 'linear'"),
    ({"vcpo_ess_base_ratio": 0.0}, r"VCPOGRPOConfig.vcpo_ess_base_ratio: Input should be greater than 0"),
    ({"vcpo_ess_base_ratio": 1.5}, r"VCPOGRPOConfig.vcpo_ess_base_ratio: Input should be less than or equal to 1"),
    ({"vcpo_ess_weight_cap": 0.0}, r"VCPOGRPOConfig.vcpo_ess_weight_cap: Input should be greater than 0"),
    ({"vcpo_baseline": "mean"}, r"VCPOGRPOConfig.vcpo_baseline: got 'mean'"),
    ({"vcpo_ess_step": "maybe"}, r"VCPOGRPOConfig.vcpo_ess_step: Input should be a valid boolean"),
    ({"vcpo_baseline": "opob_unweighted", "multi_objective_aggregation": "normalize_then_sum"},
     r"vcpo_baseline='opob_unweighted' needs multi_objective_aggregation"),
    ({"multi_objective_aggregation": "normalize_then_sum"}, r"vcpo_baseline='opob' needs multi_objective_aggregation"),
])
def test_bad_config_is_refused_in_one_line(tmp_path, keys, match):
    with pytest.raises(ValueError, match=match) as err:
        config(VCPOGRPOConfig, tmp_path, **keys)
    assert "\n" not in str(err.value)


def test_good_configs_and_the_trainer_checks(tiny_dir, tmp_path):
    """The ranges' edges are accepted; an unknown mu_source is refused before the model loads (a missing path);
    the trainer needs VCPOGRPOConfig."""
    config(VCPOGRPOConfig, tmp_path, vcpo_ess_rule="linear", vcpo_ess_base_ratio=1.0, vcpo_ess_weight_cap=8.0,
           vcpo_baseline="group_mean", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match=r"^VCPOGRPOTrainer\(mu_source='vllm'\); choose one of") as err:
        VCPOGRPOTrainer(model=str(tmp_path / "missing"), reward_funcs=reward_digits,
                        args=config(VCPOGRPOConfig, tmp_path), mu_source="vllm")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"VCPOGRPOTrainer\(mu_source='sampling'\) needs the generator's"):
        VCPOGRPOTrainer(model=str(tmp_path / "missing"), reward_funcs=reward_digits,
                        args=config(VCPOGRPOConfig, tmp_path), mu_source="sampling")
    with pytest.raises(TypeError, match="VCPOGRPOConfig"):
        trainer(VCPOGRPOTrainer, GRPOConfig, tiny_dir, tmp_path)
