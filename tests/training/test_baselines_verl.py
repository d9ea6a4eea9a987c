"""satrl's RLOO and optimal token baseline (satrl.training.advantages) equal verl's own functions on the same tensors:
``compute_rloo_outcome_advantage`` and its vectorized twin, ``compute_optimal_token_baseline_advantage`` (with and
without its zero tail, with verl's own rollout correction weights, ``compute_rollout_correction_weights``), and
verl's sum_v pi^2 from logits against the trainer's forward (``response_probs``). Without verl these skip with the
reason, except under ``SATRL_REQUIRE_VERL=1`` (``make test-verl``), where the first test fails instead."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from run_helpers import Extra
from satrl.training.advantages import optimal_token_baseline, rloo_advantages, rollout_is_weights

with Extra("verl") as verl_extra:
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits
VERL_MISSING = verl_extra.missing
needs_verl = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))


def test_verl_is_installed_when_required():
    if os.environ.get("SATRL_REQUIRE_VERL") == "1":  # `make test-verl`, whose environment has the verl extra
        assert VERL_MISSING is None, f"SATRL_REQUIRE_VERL=1 but {VERL_MISSING}"


def case(seed: int, groups: int = 4, size: int = 4, t: int = 7):
    """Rewards, prompt ids, a response mask of varied lengths (one group with a single longest response, one with a
    tie, one response empty, one group of one), log pi_old and sum_v pi^2 from random logits, log mu."""
    g = torch.Generator().manual_seed(seed)
    b = groups * size + 1
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[:3] = torch.tensor([t, t - 2, 3])  # group 0: one longest response
    lengths[4:6] = t  # group 1: two longest
    lengths[9] = 0
    mask = torch.arange(t)[None] < lengths[:, None]
    logits = torch.randn(b, t, 11, generator=g) * 2
    lsm = torch.log_softmax(logits, -1)
    ids = torch.randint(0, 11, (b, t), generator=g)
    old = lsm.gather(-1, ids[..., None]).squeeze(-1)
    rewards = torch.randint(0, 3, (b,), generator=g).float()
    rewards[12:16] = 1.0  # a group whose rewards are all equal
    index = np.array([f"p{i // size}" for i in range(b)], dtype=object)  # the last row: a group of one
    mu = old + torch.randn(b, t, generator=g) * 0.3
    return rewards, index, mask, old, calculate_sum_pi_squared_from_logits(logits), mu


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's token_level_rewards for an outcome reward: R at each response's last token."""
    out = torch.zeros(mask.shape)
    for i, n in enumerate(mask.sum(1).tolist()):
        if n:
            out[i, n - 1] = rewards[i]
    return out


def group_ids(index: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.unique(index, return_inverse=True)[1])


@needs_verl
@pytest.mark.parametrize("seed", range(3))
def test_rloo_equals_verls(seed):
    rewards, index, mask, *_ = case(seed)
    m, r = mask.float(), token_rewards(rewards, mask)
    # verl's score: an empty response's is 0
    ours = rloo_advantages(r.sum(-1), group_ids(index), std_norm=False)
    adv, _ = core_algos.compute_rloo_vectorized_outcome_advantage(r, m, index)
    torch.testing.assert_close(ours[:, None] * m, adv, rtol=1e-6, atol=1e-6)
    # verl's loop version agrees but for a group of one, where it keeps R (the vectorized one, and we, give 0)
    adv, _ = core_algos.compute_rloo_outcome_advantage(r, m, index)
    torch.testing.assert_close(ours[:-1, None] * m[:-1], adv[:-1], rtol=1e-6, atol=1e-6)
    assert ours[-1] == 0 and adv[-1, 0] == rewards[-1]


@needs_verl
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("rollout_is", ["none", "token", "sequence"])
def test_otb_equals_verls(seed, zero_tail, rollout_is):
    rewards, index, mask, old, sq, mu = case(seed)
    m = mask.float()
    rho = None
    if rollout_is != "none":
        rho, _ = compute_rollout_correction_weights(
            old - mu, m, rollout_is=rollout_is, rollout_is_threshold=2.0
        )
        torch.testing.assert_close(rollout_is_weights(old, mu, mask, rollout_is, 2.0), rho)
    want, _ = core_algos.compute_optimal_token_baseline_advantage(
        token_rewards(rewards, mask), m, index, old, sq, rollout_is_weights=rho, handle_zero_tail=zero_tail
    )
    got = optimal_token_baseline(rewards, group_ids(index), mask, old, sq, rho, zero_tail)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(want, torch.zeros_like(want))


@needs_verl
def test_sum_pi_squared_equals_verls_from_the_trainers_logits():
    from test_trainer import make_batch

    from satrl.models import build_char_tokenizer, build_tiny_model
    from satrl.training.logprobs import response_probs

    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    batch = make_batch(tok)
    _, sq = response_probs(model, batch, 0.7)
    with torch.no_grad():
        logits = (
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits.float() / 0.7
        )
    for i in range(batch.mask.shape[0]):
        n, p = int(batch.mask[i].sum()), int(batch.prompt_len[i])
        # verl's actor divides the logits by the temperature too
        want = calculate_sum_pi_squared_from_logits(logits[i, p - 1 : p - 1 + n])
        torch.testing.assert_close(sq[i, :n], want, rtol=1e-5, atol=1e-7)
