"""`sat_clipfrac` counts exactly the tokens whose gradient SAT changes relative to PPO (Prop. 4.1 (iii))."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.objectives import policy_loss


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), spread=st.floats(0.05, 0.6))
def test_sat_clipfrac_counts_tokens_with_changed_gradient(seed, spread):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 20
    blp = -torch.rand(B, T, generator=g) * 3
    base = blp + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    grads, metrics = {}, {}
    for name in ("grpo", "sat_grpo"):
        logp = base.clone().requires_grad_()
        loss, m, _ = policy_loss(name, logp=logp, behavior_logp=blp, adv=adv, mask=mask, kl_coef=0.0)
        loss.sum().backward()
        grads[name], metrics[name] = logp.grad, m
    changed = int(((grads["grpo"] != grads["sat_grpo"]) & mask).sum())
    n = int(mask.sum())
    assert round(float(metrics["sat_grpo"]["sat_clipfrac"]) * n) == changed
