"""The advantage baselines (satrl.training.advantages, chosen by train.advantage in satrl.training.baselines):
hand-derived values, their properties (RLOO sums to 0 per group, equal rewards give 0, adv_std_norm divides every
one by sigma_g + 1e-6), the config's round trip, the trainer's inputs for OTB, and a tiny run each. verl's own
functions on the same tensors: tests/training/test_baselines_verl.py."""

import copy

import pytest
import torch
from test_trainer import make_batch

from satrl.config import ConfigError, check_before_run, load_config
from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import resolve_objective
from satrl.training.advantages import (
    AdvantageInputs,
    constant_offset_advantages,
    group_advantages,
    optimal_token_baseline,
    rloo_advantages,
    rollout_is_weights,
)
from satrl.training.baselines import ADVANTAGES, DEFAULT_ADVANTAGE, resolve_advantage
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 4.0])
G = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])  # g0: [1, 0, 0, 0], g1: [1, 1] (all equal), g2: [2, 4]


def sigma(x):
    return (x - x.mean()).square().mean().sqrt()


# -- by hand -------------------------------------------------------------------------------------------
def test_constant_offset_by_hand():
    # c = 0.1: g0 mean 0.25, min 0 -> b = max(0.15, 0) = 0.15; g1 all equal -> 0; g2 mean 3, min 2 -> b = 2.9
    adv = constant_offset_advantages(R, G, 0.1, std_norm=False)
    torch.testing.assert_close(adv, torch.tensor([0.85, -0.15, -0.15, -0.15, 0.0, 0.0, -0.9, 1.1]))
    # c = 0.5: g0 b = max(-0.25, 0) = 0 (floored at the worst reward: it is never pushed up); g2 b = max(2.5, 2)
    adv = constant_offset_advantages(R, G, 0.5, std_norm=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, 1.5]))
    # std_norm: g0's sigma = sqrt((0.75^2 + 3 * 0.25^2) / 4) = sqrt(0.1875); g2's = 1
    std = constant_offset_advantages(R, G, 0.1)
    torch.testing.assert_close(std[:4], torch.tensor([0.85, -0.15, -0.15, -0.15]) / (0.1875**0.5 + 1e-6))
    torch.testing.assert_close(std[6:], torch.tensor([-0.9, 1.1]) / (1 + 1e-6))
    # c = 0 is GRPO's group mean
    torch.testing.assert_close(constant_offset_advantages(R, G, 0.0), group_advantages(R, G))


def test_rloo_by_hand():
    # g0 [1, 0, 0, 0]: b_0 = (0 + 0 + 0) / 3 = 0 -> 1; b_1 = (1 + 0 + 0) / 3 -> -1/3 (each zero);
    # g1 equal -> 0; g2 [2, 4]: b = the other one -> -2, 2; a group of one (g3) -> 0
    r, g = torch.cat([R, torch.tensor([5.0])]), torch.cat([G, torch.tensor([3])])
    adv = rloo_advantages(r, g, std_norm=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, -2.0, 2.0, 0.0]))
    std = rloo_advantages(r, g)
    torch.testing.assert_close(std[6:8], torch.tensor([-2.0, 2.0]) / (1 + 1e-6))
    assert std[8] == 0  # a group of one: 0, not 0 / eps


def otb_case():
    """Two responses of one prompt, T = 2: row 0 two tokens, R = 1; row 1 one token, R = 0. Every pi_old(y_t) =
    0.5 and sum_v pi^2 = 0.5, so w_t = 1 - 2 * 0.5 + 0.5 = 0.5 on each active token."""
    mask = torch.tensor([[True, True], [True, False]])
    old_logp = torch.full((2, 2), 0.5).log()
    return torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, old_logp, torch.full((2, 2), 0.5)


def test_otb_by_hand():
    r, g, mask, old_logp, sq = otb_case()
    # returns G: row 0 [1, 1], row 1 [0, -]; W = cumsum(w * mask): row 0 [0.5, 1.0], row 1 [0.5, 0.5]
    # t = 0: B = (1 * 0.5 + 0 * 0.5) / (0.5 + 0.5) = 0.5;  t = 1: B = (1 * 1.0) / 1.0 = 1 (row 1 inactive there)
    adv = optimal_token_baseline(r, g, mask, old_logp, sq, handle_zero_tail=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0], [-0.5, 0.0]]))
    # zero tail: row 0 is the one longest (2 > 1): its baseline from column 1 on is 0, so A = G = 1 there
    adv = optimal_token_baseline(r, g, mask, old_logp, sq)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0], [-0.5, 0.0]]))
    # rho = 2 on row 0's first token: w = 0.5 * 4 = 2, W row 0 [2, 2.5]; t = 0: B = 2 / (2 + 0.5) = 0.8
    rho = torch.tensor([[2.0, 1.0], [1.0, 0.0]])
    adv = optimal_token_baseline(r, g, mask, old_logp, sq, rho, handle_zero_tail=False)
    torch.testing.assert_close(adv, torch.tensor([[0.2, 0.0], [-0.8, 0.0]]))
    # std_norm: sigma of [1, 0] is 0.5
    adv = optimal_token_baseline(r, g, mask, old_logp, sq, std_norm=True)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0], [-0.5, 0.0]]) / (0.5 + 1e-6))


def test_rollout_is_weights_by_hand():
    mask = torch.tensor([[True, True, False]])
    old = torch.tensor([[3.0, 0.5, 9.0]]).log()  # pi_old / mu = 3, 0.5 (mu = 1 below); 9 is padding
    tok = rollout_is_weights(old, torch.zeros(1, 3), mask, "token", 2.0)
    torch.testing.assert_close(tok, torch.tensor([[2.0, 0.5, 0.0]]))  # min(3, 2), 0.5, masked
    seq = rollout_is_weights(old, torch.zeros(1, 3), mask, "sequence", 2.0)
    torch.testing.assert_close(seq, torch.tensor([[1.5, 1.5, 0.0]]))  # 3 * 0.5 = 1.5 < 2


# -- properties ------------------------------------------------------------------------------------------
def random_groups(seed, groups=5, size=4):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 4, (groups * size,), generator=gen).float() / 3
    r[:size] = 0.7  # one group whose rewards are all equal
    return r, torch.arange(groups).repeat_interleave(size)


@pytest.mark.parametrize("seed", range(3))
def test_rloo_sums_to_zero_per_group_and_is_n_over_n_minus_1_times_grpo(seed):
    r, g = random_groups(seed)
    adv = rloo_advantages(r, g, std_norm=False)
    torch.testing.assert_close(torch.zeros(5).index_add_(0, g, adv), torch.zeros(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, group_advantages(r, g, std_norm=False) * 4 / 3, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["group_mean", "constant_offset", "rloo", "otb"])
@pytest.mark.parametrize("std_norm", [True, False])
def test_equal_rewards_give_zero(name, std_norm):
    r, g = random_groups(0)
    adv, _ = call(name, r, g, std_norm)
    if name == "otb" and not std_norm:
        return  # verl's numbers: R * eps / W on shared positions, R on a zero tail (optimal_token_baseline's doc)
    assert torch.equal(adv[:4], torch.zeros_like(adv[:4]))


@pytest.mark.parametrize("name", ["constant_offset", "rloo", "otb"])
def test_std_norm_divides_every_baseline_by_the_group_std(name):
    r, g = random_groups(1)
    on, off = call(name, r, g, True)[0], call(name, r, g, False)[0]
    for k in range(1, 5):  # the groups with unequal rewards
        rows = g == k
        torch.testing.assert_close(on[rows], off[rows] / (sigma(r[rows]) + 1e-6))


def call(name, r, g, std_norm):
    """The registry's baseline ``name`` on rewards ``r`` with random token inputs for OTB (T = 3)."""
    gen = torch.Generator().manual_seed(7)
    mask = torch.rand(len(r), 3, generator=gen) > 0.3
    mask[:, 0] = True
    old = -torch.rand(len(r), 3, generator=gen)
    inp = AdvantageInputs(r, g, mask, old - 0.1, old_logp=old, sum_pi_sq=torch.rand(len(r), 3, generator=gen))
    params = resolve_advantage(name)
    return ADVANTAGES.get(name).fn(inp, std_norm=std_norm, **params.kwargs())


# -- config ----------------------------------------------------------------------------------------------
def test_config_round_trip_and_errors(tmp_path):
    cfg = load_config(None, ["train.advantage.name=constant_offset", "train.advantage.c=0.5"])
    assert cfg.train.advantage.model_dump() == {"name": "constant_offset", "c": 0.5}
    saved = tmp_path / "config.yaml"
    import yaml

    saved.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(saved, []).train.advantage == cfg.train.advantage
    assert load_config(None, []).train.advantage == DEFAULT_ADVANTAGE
    otb = load_config(None, ["train.advantage=otb"]).train.advantage.model_dump()
    assert otb == {"name": "otb", "handle_zero_tail": True, "rollout_is": "none", "rollout_is_threshold": 2.0}
    for bad, field in ((["train.advantage=rlo"], "valid choices: .*rloo"), (["train.advantage.name=rloo", "train.advantage.c=1"],
                       "c: unknown key"), (["train.advantage.name=constant_offset", "train.advantage.c=-1"], "c:")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"invalid config: train.advantage: .*{field}"):
            load_config(None, bad)


def test_an_objective_with_its_own_baseline_refuses_another():
    with pytest.raises(ConfigError, match="train.advantage=rloo: objective 'vcpo' brings its own"):
        check_before_run(load_config(None, ["objective.name=vcpo", "train.advantage=rloo"]))
    check_before_run(load_config(None, ["objective.name=vcpo", "objective.baseline=group_mean",
                                        "train.advantage=rloo"]))  # fmt: skip
    # OPOB for any objective, through the registry
    check_before_run(load_config(None, ["train.advantage=opob"]))


# -- the trainer -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def test_token_probs_are_the_trainers_logp_and_the_softmax_square_sum(tiny):
    model, tok = tiny
    batch = make_batch(tok)
    t = Trainer(copy.deepcopy(model), resolve_objective("grpo"), TrainerSettings(lr=1e-2, temperature=0.7))
    logp, sq = t.advantages.token_probs(batch)
    torch.testing.assert_close(
        torch.where(batch.mask, logp, 0.0), torch.where(batch.mask, t.logp_with(None, batch), 0.0)
    )
    with torch.no_grad():  # naive: the full softmax of every position, squared and summed
        logits = t.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    for i in range(batch.mask.shape[0]):
        for j in torch.nonzero(batch.mask[i]).flatten().tolist():
            p = torch.softmax(logits[i, int(batch.prompt_len[i]) + j - 1].float() / 0.7, -1)
            assert float(sq[i, j]) == pytest.approx(float(p.square().sum()), rel=1e-5)
    chunked = Trainer(copy.deepcopy(model), resolve_objective("grpo"),
                      TrainerSettings(lr=1e-2, temperature=0.7, logprob_chunk_tokens=3))  # fmt: skip
    for a, b in zip(chunked.advantages.token_probs(batch), (logp, sq)):
        torch.testing.assert_close(torch.where(batch.mask, a, 0.0), torch.where(batch.mask, b, 0.0))


def test_trainer_steps_on_the_chosen_baseline(tiny, monkeypatch):
    model, tok = tiny
    batch = make_batch(tok)
    batch.rewards[:] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    for name, want in (("rloo", rloo_advantages(batch.rewards, batch.group_index)),
                       ("group_mean", group_advantages(batch.rewards, batch.group_index))):  # fmt: skip
        t = Trainer(copy.deepcopy(model), resolve_objective("grpo"), TrainerSettings(lr=1e-2, advantage=name))
        got = []
        monkeypatch.setattr(t, "step", lambda mb, adv, *a, got=got: got.append(adv) or {})
        ((_, rows),) = list(t.train_batch(batch, 0, lambda v: None, stop_at=1))
        assert torch.equal(got[0], want[rows])
    # train.advantage=opob on grpo: VCPO's baseline through the registry, the same numbers as vcpo's own
    t = Trainer(copy.deepcopy(model), resolve_objective("grpo"), TrainerSettings(lr=1e-2, advantage="opob"))
    vcpo = Trainer(copy.deepcopy(model), resolve_objective("vcpo"), TrainerSettings(lr=1e-2))
    (adv, metrics), (want, want_metrics) = t.advantages(batch), vcpo.advantages(batch)
    assert torch.equal(adv, want) and metrics == want_metrics and metrics["obj/opob_shift"] > 0
    t = Trainer(copy.deepcopy(model), resolve_objective("grpo"), TrainerSettings(lr=1e-2, advantage="otb"))
    adv, metrics = t.advantages(batch)
    old, sq = t.advantages.token_probs(batch)
    assert adv.shape == batch.mask.shape and metrics == {}
    assert torch.equal(
        adv, optimal_token_baseline(batch.rewards, batch.group_index, batch.mask, old, sq, std_norm=True)
    )


@pytest.mark.parametrize("advantage", [["train.advantage=rloo"], ["train.advantage=otb", "train.adv_std_norm=false"],
                                       ["train.advantage.name=constant_offset", "train.advantage.c=0.3"]])  # fmt: skip
def test_a_tiny_run_per_baseline(run_tiny, advantage):
    import yaml

    from run_helpers import read_jsonl

    out = run_tiny("steps=2", *advantage)
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows)
    saved = yaml.safe_load((out / "config.yaml").read_text())["train"]
    assert saved["advantage"] == load_config(None, advantage).train.advantage.model_dump()
