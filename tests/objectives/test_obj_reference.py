"""Every preset equals the naive per-token loop reference, values and gradients."""

import pytest
import torch
from objectives_naive import naive_policy_loss

from satrl.objectives import available_presets, policy_loss, resolve_objective


def make(seed, B=4, T=6, spread=0.3, adv_dim=1):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05)
    blp = (logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    old = (logp + 0.5 * spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    ref = logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    adv = torch.randn(B, generator=g, dtype=torch.float64) if adv_dim == 1 else torch.randn(
        B, T, generator=g, dtype=torch.float64)
    return logp, blp, old, ref, mask, adv


def lags_if_needed(preset, logp, seed=0):
    """Per-token lags 0..4 for a preset that declares it reads them (A-3PO), else None."""
    if "lag" not in resolve_objective(preset).needs:
        return None
    return torch.randint(0, 5, logp.shape, generator=torch.Generator().manual_seed(seed))


CASES = [
    {},
    {"use_ref": True},
    {"use_old": True},
    {"use_ref": True, "use_old": True, "adv_dim": 2},
]


@pytest.mark.parametrize("preset", available_presets())
@pytest.mark.parametrize("case", range(len(CASES)))
def test_preset_matches_naive_loop(preset, case):
    c = CASES[case]
    for seed in range(3):
        logp, blp, old, ref, mask, adv = make(seed + 10 * case, adv_dim=c.get("adv_dim", 1))
        kw = {"ref_logp": ref if c.get("use_ref") else None, "old_logp": old if c.get("use_old") else None}
        kw["lag"] = lags_if_needed(preset, logp)
        lp1 = logp.clone().requires_grad_()
        loss, metrics, _ = policy_loss(preset, logp=lp1, behavior_logp=blp, adv=adv, mask=mask, **kw)
        (g1,) = torch.autograd.grad(loss.sum(), lp1)
        lp2 = logp.clone().requires_grad_()
        ref_tok, total = naive_policy_loss(preset, lp2, blp, adv, mask, **kw)
        (g2,) = torch.autograd.grad(total, lp2, allow_unused=True)
        g2 = torch.zeros_like(logp) if g2 is None else g2
        torch.testing.assert_close(loss.detach(), ref_tok, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("overrides", [
    {"dual_clip": 1.5}, {"alpha": 0.5, "exponent": 1.0}, {"eps_low": 0.1, "eps_high": 0.28},
    {"correction": "tis", "correction_level": "sequence"}, {"correction": "icepop", "icepop_low": 0.9},
    {"correction": "mis", "mis_threshold": 1.1}, {"kl": "k1"}, {"kl": "k2"},
])
@pytest.mark.parametrize("preset", ["sat_grpo", "sat_gspo"])
def test_overrides_match_naive_loop(preset, overrides):
    logp, blp, old, ref, mask, adv = make(7, B=5, T=7, spread=0.5, adv_dim=2)
    lp1 = logp.clone().requires_grad_()
    loss, _, _ = policy_loss(preset, logp=lp1, behavior_logp=blp, adv=adv, mask=mask, ref_logp=ref,
                          old_logp=old, **overrides)
    (g1,) = torch.autograd.grad(loss.sum(), lp1)
    lp2 = logp.clone().requires_grad_()
    ref_tok, total = naive_policy_loss(preset, lp2, blp, adv, mask, ref_logp=ref, old_logp=old, **overrides)
    (g2,) = torch.autograd.grad(total, lp2)
    torch.testing.assert_close(loss.detach(), ref_tok, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)
