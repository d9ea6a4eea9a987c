"""verl's rejection masks (``grpo_geo_mask``, ``grpo_k3_mask`` and every level / estimator they expose) drop
exactly the tokens verl's own ``compute_rollout_rejection_mask`` (verl 0.9.1,
``verl/trainer/ppo/rollout_corr_helper.py``) drops, on random float32 tensors, for all eleven ``rollout_rs``
options. Without verl these skip with the reason, except under ``SATRL_REQUIRE_VERL=1`` (``make test-verl``),
where the first test fails instead.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from run_helpers import Extra
from satrl.objectives import policy_loss

with Extra("verl") as verl_extra:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask
VERL_MISSING = verl_extra.missing


needs_verl = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))

# verl's option, its threshold as verl takes it (k1: "low_high" ratio bounds), and the per-response / per-token
# spread of log(pi_old / mu) that puts some responses (tokens) on each side of it.
OPTIONS = [
    ("token_k1", "0.999_1.001", 0.0, 0.001),
    ("seq_sum_k1", "0.5_2.0", 0.04, 0.02),
    ("seq_mean_k1", "0.999_1.001", 0.001, 0.002),  # verl's decoupled_geo_rs: grpo_geo_mask's default
    ("token_k2", 0.01, 0.0, 0.15),
    ("seq_sum_k2", 0.1, 0.05, 0.1),
    ("seq_mean_k2", 0.01, 0.1, 0.05),
    ("seq_max_k2", 0.02, 0.0, 0.08),
    ("token_k3", 0.01, 0.0, 0.15),
    ("seq_sum_k3", 0.1, 0.05, 0.1),
    ("seq_mean_k3", 0.01, 0.1, 0.05),  # verl's decoupled_k3_rs: grpo_k3_mask's default
    ("seq_max_k3", 0.02, 0.0, 0.08),
]


def test_verl_is_installed_when_required():
    if os.environ.get("SATRL_REQUIRE_VERL") == "1":  # `make test-verl`, whose environment has the verl extra
        assert VERL_MISSING is None, f"SATRL_REQUIRE_VERL=1 but {VERL_MISSING}"


def satrl_overrides(option: str, threshold) -> tuple[str, dict]:
    """The preset and its overrides that mean verl's ``option`` with ``threshold``."""
    level, estimator = option.rsplit("_", 1)
    if estimator == "k1":
        low, high = (float(x) for x in threshold.split("_"))
        return "grpo_geo_mask", {"geo_level": level, "geo_low": low, "geo_high": high}
    return "grpo_k3_mask", {"kl_estimator": estimator, "kl_level": level, "kl_threshold": float(threshold)}


def stale_batch(seed: int, seq_spread: float, tok_spread: float, b: int = 32, t: int = 20):
    """log pi_old - log mu with a per-response offset and per-token noise, finite garbage (50.0) where masked
    (verl's token statistics are computed on the padding too), one empty response."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.2
    mask[:, 0] = True
    mask[5] = False
    old = torch.randn(b, t, generator=g) * 0.5 - 1.5
    lr = seq_spread * torch.randn(b, 1, generator=g) + tok_spread * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    return torch.where(mask, old, 50.0), torch.where(mask, old - lr, 50.0), mask, adv


@pytest.mark.parametrize("option,threshold,seq_spread,tok_spread", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_our_masks_are_the_options_own_kind(option, threshold, seq_spread, tok_spread):
    """Runs everywhere: each option's data has tokens on both sides, and a sequence option drops whole
    responses (so the verl comparison below can fail)."""
    old, blp, mask, adv = stale_batch(0, seq_spread, tok_spread)
    preset, kw = satrl_overrides(option, threshold)
    dropped = policy_loss(preset, logp=old, behavior_logp=blp, adv=adv, mask=mask, old_logp=old, **kw).tokens.clipped
    assert (dropped & mask).any() and (~dropped & mask).any(), option
    if not option.startswith("token"):
        per_row = [set(dropped[i][mask[i]].tolist()) for i in range(mask.shape[0]) if mask[i].any()]
        assert all(len(s) == 1 for s in per_row)


@needs_verl
@pytest.mark.parametrize("option,threshold,seq_spread,tok_spread", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_rejection_masks_equal_verls(option, threshold, seq_spread, tok_spread):
    for seed in range(3):
        old, blp, mask, adv = stale_batch(seed, seq_spread, tok_spread)
        verl_mask, metrics = compute_rollout_rejection_mask(
            log_ratio=old - blp, response_mask=mask.float(), rollout_rs=option, rollout_rs_threshold=threshold
        )
        preset, kw = satrl_overrides(option, threshold)
        out = policy_loss(preset, logp=old, behavior_logp=blp, adv=adv, mask=mask, old_logp=old, **kw)
        verl_dropped = mask & (verl_mask == 0)
        assert verl_dropped.any() and (mask & (verl_mask != 0)).any()
        assert torch.equal(out.tokens.clipped, verl_dropped), option
        key = "geo_mask_frac" if option.endswith("k1") else "kl_mask_frac"
        assert float(out.metrics[key]) == pytest.approx(metrics["rollout_rs_masked_fraction"], abs=1e-6)


@needs_verl
def test_presets_default_to_verls_recipes():
    """grpo_geo_mask / grpo_k3_mask with no overrides are verl's decoupled_geo_rs / decoupled_k3_rs masks."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    for preset, recipe, spreads in (("grpo_geo_mask", RolloutCorrectionConfig.decoupled_geo_rs(), (0.001, 0.002)),
                                    ("grpo_k3_mask", RolloutCorrectionConfig.decoupled_k3_rs(), (0.1, 0.05))):  # fmt: skip
        old, blp, mask, adv = stale_batch(7, *spreads)
        verl_mask, _ = compute_rollout_rejection_mask(old - blp, mask.float(), recipe.rollout_rs,
                                                      recipe.rollout_rs_threshold)  # fmt: skip
        out = policy_loss(preset, logp=old, behavior_logp=blp, adv=adv, mask=mask, old_logp=old)
        assert recipe.rollout_is is None  # verl's recipes weigh kept tokens by 1, as the correction does
        assert torch.equal(out.tokens.clipped, mask & (verl_mask == 0)), preset


def test_geo_bounds_are_log_ratio_bounds():
    """The k1 bounds are on mu / pi_old: a response whose mean log(pi_old / mu) is just inside -log(0.999)
    is kept, just outside is dropped."""
    inside, outside = -math.log(0.999) * 0.99, -math.log(0.999) * 1.01
    old = torch.full((2, 3), -1.0)
    blp = old - torch.tensor([[inside], [outside]])
    out = policy_loss("grpo_geo_mask", logp=old, behavior_logp=blp, adv=torch.ones(2),
                      mask=torch.ones(2, 3, dtype=torch.bool), old_logp=old)  # fmt: skip
    assert out.tokens.clipped.tolist() == [[False] * 3, [True] * 3]
