"""The peers' presets (cispo, sapo, gmpo) equal verl's own policy losses: loss value and gradient.

verl's ``cispo``, ``sapo`` and ``geo_mean`` from ``verl.trainer.ppo.core_algos`` are called exactly as
verl's actor calls them (its ``ActorConfig``). Without verl these skip with the reason, except under
``SATRL_REQUIRE_VERL=1`` (``make test-verl``), where the first test fails instead.
"""

from __future__ import annotations

import os

import pytest
import torch

from run_helpers import Extra
from satrl.objectives import aggregate, policy_loss

with Extra("verl") as verl_extra:
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig
VERL_MISSING = verl_extra.missing


needs_verl = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SATRL_AGG_MODES = [m for m in AGG_MODES if m != "token-sum"]


def test_verl_is_installed_when_required():
    if os.environ.get("SATRL_REQUIRE_VERL") == "1":  # `make test-verl`, whose environment has the verl extra
        assert VERL_MISSING is None, f"SATRL_REQUIRE_VERL=1 but {VERL_MISSING}"


def actor_config(**kw) -> ActorConfig:
    """verl's actor config as its trainer builds it: radii 0.2 / 0.28 unless given."""
    return ActorConfig(**{"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 2,
                          "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, **kw})  # fmt: skip


def batch(seed: int, b: int = 8, t: int = 16, empty: bool = True, drift: float = 0.3, noise: float = 0.4):
    """Stale-looking microbatch with finite garbage (50.0) on masked positions of ``old`` (verl's losses
    multiply by the mask, so NaN padding would reach their loss); one empty response if ``empty``."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.2
    mask[:, 0] = True
    if empty:
        mask[3] = False
    old = torch.randn(b, t, generator=g) * 0.5 - 1.5
    logp = old + torch.randn(b, 1, generator=g) * drift + torch.randn(b, t, generator=g) * noise
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    adv[0] = -1.0
    return {"old": torch.where(mask, old, 50.0), "logp": logp, "adv": adv, "mask": mask}


def verl_run(name, x, mode, config):
    logp = x["logp"].clone().requires_grad_()
    loss, metrics = core_algos.get_policy_loss_fn(name)(x["old"], logp, x["adv"], x["mask"],
                                                        loss_agg_mode=mode, config=config)  # fmt: skip
    loss.backward()
    return loss.detach(), logp.grad, metrics


def satrl_run(preset, x, **overrides):
    """(per-token loss, logp leaf, metrics): aggregate it and backward to get the gradient."""
    logp = x["logp"].clone().requires_grad_()
    loss_tok, metrics, _ = policy_loss(preset, logp=logp, behavior_logp=x["old"], adv=x["adv"], mask=x["mask"],
                                       **overrides)  # fmt: skip
    return loss_tok, logp, metrics


def grad_of(loss_tok, logp, reduce):
    (g,) = torch.autograd.grad(reduce(loss_tok), logp, retain_graph=True)
    return g


@needs_verl
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("radii", [(0.2, 0.28), (1.0, 4.0)], ids=["verl-radii", "satrl-defaults"])
def test_cispo_equals_verls_cispo(mode, radii):
    """Value and gradient bit for bit under verl's agg_loss; our aggregate differs from it only by the
    reduction order (0 in the mean modes, at most 2 ulp in the sum modes), its gradient not at all."""
    x = batch(0)
    lo, hi = radii
    loss, grad, m = verl_run("cispo", x, mode, actor_config(clip_ratio_low=lo, clip_ratio_high=hi))
    loss_tok, logp, ours = satrl_run("cispo", x, eps_low=lo, eps_high=hi)
    mask = x["mask"]
    assert torch.equal(loss, core_algos.agg_loss(loss_tok.detach(), mask, mode))
    assert torch.equal(grad, grad_of(loss_tok, logp, lambda t: core_algos.agg_loss(t, mask, mode)))
    assert grad.abs().sum() > 0
    if lo == 0.2:
        assert m["actor/pg_clipfrac"] > 0.1  # the weight clip is exercised
    assert m["actor/pg_clipfrac"] == pytest.approx(float(ours["is_clipfrac_high"] + ours["is_clipfrac_low"]))
    assert m["actor/ppo_kl"] == pytest.approx(float(ours["ppo_kl"]), rel=1e-5, abs=1e-7)
    if mode in SATRL_AGG_MODES:
        ref = aggregate(loss_tok, mask, mode)
        ulp = torch.finfo(torch.float32).eps * ref.abs()
        assert (loss - ref).abs() <= (0 if "token-mean" in mode else 2 * ulp)
        assert torch.equal(grad, grad_of(loss_tok, logp, lambda t: aggregate(t, mask, mode)))


@needs_verl
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 3.0)], ids=["paper", "other"])
def test_sapo_equals_verls_sapo(mode, taus):
    """verl's sapo always aggregates seq-mean-token-mean, whatever loss_agg_mode says: equal to ours under
    that mode, bit for bit in value and gradient."""
    x = batch(1)
    loss, grad, _ = verl_run("sapo", x, mode, actor_config(tau_pos=taus[0], tau_neg=taus[1]))
    loss_tok, logp, _ = satrl_run("sapo", x, tau_pos=taus[0], tau_neg=taus[1])
    reduce = lambda t: aggregate(t, x["mask"], "seq-mean-token-mean")  # noqa: E731
    assert torch.equal(loss, reduce(loss_tok).detach())
    assert torch.equal(grad, grad_of(loss_tok, logp, reduce))
    assert grad.abs().sum() > 0


@needs_verl
@pytest.mark.parametrize("mode", AGG_MODES)
def test_gmpo_equals_verls_geo_mean(mode):
    """verl's geo_mean ignores loss_agg_mode too: it is ours under seq-mean-token-mean (equal up to the
    order of float operations, so to 1e-6), with verl's radii passed as GMPO's log-space radii."""
    x = batch(2, empty=False)
    loss, grad, m = verl_run("geo_mean", x, mode, actor_config())
    loss_tok, logp, ours = satrl_run("gmpo", x, eps_low=0.2, eps_high=0.28)
    reduce = lambda t: aggregate(t, x["mask"], "seq-mean-token-mean")  # noqa: E731
    torch.testing.assert_close(loss, reduce(loss_tok).detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, grad_of(loss_tok, logp, reduce), rtol=1e-5, atol=1e-8)
    assert m["actor/pg_clipfrac"] > 0 and float(ours["clipfrac"]) > 0  # the clip is exercised
    assert (grad == 0).sum() > (~x["mask"]).sum()  # clipped tokens lose their gradient


@needs_verl
def test_gmpo_with_an_empty_response_departs_from_verl_by_the_response_count():
    """verl's geo_mean averages over all B responses, empty ones included; ours over the B' non-empty."""
    x = batch(3, empty=True)
    loss, _, _ = verl_run("geo_mean", x, "token-mean", actor_config())
    loss_tok, _, _ = satrl_run("gmpo", x, eps_low=0.2, eps_high=0.28)
    b, b_nonempty = x["mask"].shape[0], int(x["mask"].any(-1).sum())
    assert b_nonempty == b - 1
    ours = aggregate(loss_tok.detach(), x["mask"], "seq-mean-token-mean")
    torch.testing.assert_close(loss, ours * b_nonempty / b, rtol=1e-6, atol=1e-7)


@needs_verl
@pytest.mark.parametrize("preset,verl_name,kw", [
    ("sat_cispo", "cispo", {"eps_low": 0.2, "eps_high": 0.28}),
    ("sat_gmpo", "geo_mean", {"eps_low": 0.2, "eps_high": 0.28}),
])
def test_sat_with_the_gate_off_is_the_peer_loss(preset, verl_name, kw):
    """alpha = 1 gates nothing: SAT-CISPO / SAT-GMPO are verl's cispo / geo_mean."""
    x = batch(4, empty=False)
    mode = "seq-mean-token-mean"
    loss, grad, _ = verl_run(verl_name, x, mode, actor_config())
    loss_tok, logp, m = satrl_run(preset, x, alpha=1.0, **kw)
    assert float(m["gate_rate"]) == 0.0
    reduce = lambda t: aggregate(t, x["mask"], mode)  # noqa: E731
    torch.testing.assert_close(loss, reduce(loss_tok).detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, grad_of(loss_tok, logp, reduce), rtol=1e-5, atol=1e-8)
