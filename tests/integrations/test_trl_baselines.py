"""satrl's advantage baselines in TRL (``satrl.integrations.trl_baselines``), through TRL's real ``GRPOTrainer`` loop
on CPU, with the tiny policy and reward of ``test_trl.py``. Without TRL these tests skip with the reason printed;
``make test`` sets ``SATRL_REQUIRE_TRL=1``, and ``test_trl.py::test_trl_is_installed_when_required`` then fails."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from run_helpers import Extra
from satrl.models import build_char_tokenizer
from satrl.training.advantages import constant_offset_advantages
from satrl.training.baselines import ADVANTAGES

with Extra("TRL") as trl_extra:
    from datasets import Dataset
    from trl import GRPOConfig
    from trl.trainer.utils import nanstd

    from satrl.integrations.trl_baselines import (
        IN_TRL,
        BaselineGRPOConfig,
        BaselineGRPOTrainer,
        SATBaselineGRPOConfig,
        SATBaselineGRPOTrainer,
        replace_advantages,
    )
TRL_MISSING = trl_extra.missing

pytestmark = pytest.mark.skipif(TRL_MISSING is not None, reason=str(TRL_MISSING))
PROMPTS = ["1+1=", "2+3=", "7-4=", "3*3=", "8/2=", "5+5=", "9-1=", "6*2="]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


import test_trl  # noqa: E402  (the same tiny policy fixture and reward as SAT's TRL tests)
import test_trl_vcpo  # noqa: E402  (the same settings as VCPO's TRL tests, and its GRPOTrainer reference run)

tiny_dir, reward_digits, config = test_trl.tiny_dir, test_trl.reward_digits, test_trl_vcpo.config
grpo_reference = test_trl_vcpo.grpo_reference


def trainer(cls, cfg_cls, tiny_dir, out, **kw):
    return cls(model=tiny_dir, reward_funcs=reward_digits, args=config(cfg_cls, out, **kw),
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_char_tokenizer())


def train(tr):
    tr.train()
    return [h for h in tr.state.log_history if "loss" in h], [p.detach().clone() for p in tr.model.parameters()]


def untimed(h):
    return {k: v for k, v in h.items() if "time" not in k and "per_second" not in k}


def test_every_baseline_is_decided_and_the_offered_ones_read_rewards_only():
    """A new baseline in satrl's registry fails here until IN_TRL says what it is in TRL; what satrl computes in TRL
    needs nothing beyond the rewards (the plug-in gives its function no tokens)."""
    assert sorted(IN_TRL) == ADVANTAGES.names()
    offered = [n for n, r in IN_TRL.items() if r.satrl_computes]
    assert offered == ["constant_offset"]
    assert all(not ADVANTAGES.get(n).needs for n in offered)
    assert [n for n, r in IN_TRL.items() if not r.refused] == ["group_mean", "constant_offset"]


# -- the replacement, by hand: a fake trainer as process 1 of 2 --------------------------------------------------
@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_replacement_by_hand_on_process_one_of_two(scale):
    """Two processes' gathered rewards: group 0 (process 0) all 3, group 1 (process 1) [1, unscorable, 3, 5].
    constant_offset c=1 by hand on group 1: mean 3, min 1, b = max(3 - 1, 1) = 2, R - b = [-1, 0, 1, 3] (the
    unscorable row 0); group 0 all equal: 0. Process 1 keeps rows 4..7, scaled by TRL's std."""
    rpf = torch.tensor([3.0, 3.0, 3.0, 3.0, 1.0, float("nan"), 3.0, 5.0])[:, None]
    tr = SimpleNamespace(scale_rewards=scale, reward_weights=torch.ones(1), num_generations=4,
                         accelerator=SimpleNamespace(process_index=1), _logs={"advantages": [9.0] * 8},
                         args=SimpleNamespace(advantage="constant_offset", advantage_c=1.0))
    tr.args.advantage_params = lambda: BaselineGRPOConfig.advantage_params(tr.args)
    R = rpf[:, 0]
    std = {"group": torch.tensor([0.0] * 4 + [2.0] * 4),  # Bessel: ((1-3)^2 + (5-3)^2) / 2 = 4
           "none": None, "batch": nanstd(R).expand(8)}[scale]
    trl_own = torch.tensor([0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0, 2.0])  # R - nanmean, NaN -> 0
    hand = torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 1.0, 3.0])
    if std is not None:
        trl_own, hand = trl_own / (std + 1e-4), hand / (std + 1e-4)
    out = {"advantages": trl_own[4:].clone()}
    adv = replace_advantages(tr, out, rpf, lambda *a: BaselineGRPOTrainer._baseline_centre(tr, *a), "test")
    assert torch.equal(adv, hand) and torch.equal(out["advantages"], hand[4:])
    assert tr._logs["advantages"] == hand.tolist()
    out = {"advantages": trl_own[:4] + 1.0}  # not TRL's own advantages: an unsupported TRL
    with pytest.raises(RuntimeError, match="not supported by test"):
        replace_advantages(tr, out, rpf, lambda *a: a[2], "test")


# -- through TRL's loop ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_rewards,sat", [("group", False), ("batch", False), ("none", False), ("group", True)])
def test_trl_trains_on_satrls_constant_offset(tiny_dir, tmp_path, scale_rewards, sat):
    """One generation batch (2 prompts x 4), used by 2 steps (2 iterations): the generation batch's advantages are satrl's
    ``constant_offset_advantages`` (std_norm=False) of the same gathered rewards under TRL's ``scale_rewards``
    (torch.equal), different from GRPO's, and both loss calls train on them, row for row; with SAT's trainer too."""
    cls, cfg = (SATBaselineGRPOTrainer, SATBaselineGRPOConfig) if sat else (BaselineGRPOTrainer, BaselineGRPOConfig)
    tr = trainer(cls, cfg, tiny_dir, tmp_path, max_steps=2, scale_rewards=scale_rewards,
                 advantage="constant_offset", advantage_c=1.0)
    seen: dict = {"loss": []}
    rewards, generate, compute_loss = tr._calculate_rewards, tr._generate_and_score_completions, tr._compute_loss

    def spy_rewards(*args, **kwargs):
        seen["rewards_per_func"] = rewards(*args, **kwargs)
        return seen["rewards_per_func"]

    def spy_generate(inputs):
        seen["out"] = generate(inputs)
        return seen["out"]

    def spy_loss(model, inputs):
        seen["loss"].append({k: inputs[k].clone() for k in ("prompt_ids", "completion_ids", "advantages")})
        return compute_loss(model, inputs)

    tr._calculate_rewards, tr._generate_and_score_completions, tr._compute_loss = spy_rewards, spy_generate, spy_loss
    logs, _ = train(tr)
    R, G = seen["rewards_per_func"][:, 0], tr.num_generations
    std = nanstd(R.view(-1, G), dim=1).repeat_interleave(G) if scale_rewards == "group" else nanstd(R).expand_as(R)
    scaled = (lambda x: x) if scale_rewards == "none" else (lambda x: x / (std + 1e-4))
    want = scaled(constant_offset_advantages(R, torch.arange(R.numel()) // G, 1.0, std_norm=False))
    grpo = scaled(R - R.view(-1, G).mean(1).repeat_interleave(G))
    out = seen["out"]
    assert torch.equal(out["advantages"], want)
    assert float((want - grpo).abs().max()) > 0.1  # the baseline moved: not GRPO's advantages

    def by_row(batch):  # TRL shuffles the rows before the loss: match them by prompt and completion
        keys = zip(batch["prompt_ids"].tolist(), batch["completion_ids"].tolist())
        return sorted((tuple(p), tuple(c), a) for (p, c), a in zip(keys, batch["advantages"].tolist()))

    assert len(seen["loss"]) == 2 and all(by_row(b) == by_row(out) for b in seen["loss"])
    if sat:
        assert "sat/q" in logs[0]


def test_zero_offset_trains_exactly_as_grpo_and_an_offset_does_not(tiny_dir, tmp_path, grpo_reference):
    """3 steps, 2 iterations per batch: c = 0 (b_g = the group mean; the rewards are whole numbers, so every sum is
    exact) gives GRPOTrainer's logs and final weights bit for bit, through the check and the replacement; c = 1
    ends at other weights (the comparison can fail)."""
    ref_logs, ref_params = grpo_reference
    logs, params = train(trainer(BaselineGRPOTrainer, BaselineGRPOConfig, tiny_dir, tmp_path / "b",
                                 advantage="constant_offset", advantage_c=0.0))
    assert len(ref_logs) == 3 and [untimed(h) for h in logs] == [untimed(h) for h in ref_logs]
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    _, moved = train(trainer(BaselineGRPOTrainer, BaselineGRPOConfig, tiny_dir, tmp_path / "c",
                             advantage="constant_offset", advantage_c=1.0))
    assert not all(torch.equal(a, b) for a, b in zip(moved, ref_params))


# -- configuration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keys,match", [
    ({"advantage": "mean"}, r"^BaselineGRPOConfig.advantage: unknown advantage baseline 'mean'; valid choices"),
    ({"advantage": "rloo"}, r"^BaselineGRPOConfig.advantage='rloo' is not offered in TRL: TRL has RLOO: "
                            r"trl.RLOOTrainer"),
    ({"advantage": "otb"}, r"^BaselineGRPOConfig.advantage='otb' is not offered in TRL: OTB needs"),
    ({"advantage": "opob"}, r"VCPOGRPOTrainer\(vcpo_baseline='opob'\)"),
    ({"advantage": "opob_unweighted"}, r"VCPOGRPOTrainer\(vcpo_baseline='opob_unweighted'\)"),
    ({"advantage_c": 0.5}, r"^BaselineGRPOConfig.advantage_c: group_mean: c: unknown key"),
    ({"advantage": "constant_offset", "advantage_c": -0.1},
     r"^BaselineGRPOConfig.advantage_c: constant_offset: c: Input should be greater than or equal to 0"),
    ({"advantage": "constant_offset", "multi_objective_aggregation": "normalize_then_sum"},
     r"^BaselineGRPOConfig: advantage='constant_offset' needs multi_objective_aggregation='sum_then_normalize'"),
])
def test_bad_config_is_refused_in_one_line(tmp_path, keys, match):
    with pytest.raises(ValueError, match=match) as err:
        config(BaselineGRPOConfig, tmp_path, **keys)
    assert "\n" not in str(err.value)


def test_good_configs_are_saved_resolved_and_the_trainer_checks(tiny_dir, tmp_path):
    """c left unset is saved as satrl's default; SAT's keys still checked in the SAT config; the trainer needs the
    baseline's keys."""
    assert config(BaselineGRPOConfig, tmp_path, advantage="constant_offset").to_dict()["advantage_c"] == 0.1
    assert config(BaselineGRPOConfig, tmp_path).advantage_c is None  # group_mean: no parameters
    config(BaselineGRPOConfig, tmp_path, multi_objective_aggregation="normalize_then_sum")  # TRL's own: fine
    with pytest.raises(ValueError, match="SATGRPOConfig.loss_type='cispo' has no clip interval"):
        config(SATBaselineGRPOConfig, tmp_path, loss_type="cispo", advantage="constant_offset")
    with pytest.raises(TypeError, match="BaselineGRPOTrainer needs args with satrl's BaselineArgs"):
        trainer(BaselineGRPOTrainer, GRPOConfig, tiny_dir, tmp_path)
