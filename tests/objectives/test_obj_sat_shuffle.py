"""SAT's shuffle control: the same gate size and kernel values, moved to random active tokens."""

import pytest
import torch

from satrl.objectives import policy_loss, resolve_objective
from satrl.objectives.sat import sat_gate


def _inputs(B=6, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = 0.3 * torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    d[~mask] = float("nan")  # padding garbage never matters
    return d, mask


def test_shuffle_keeps_count_and_kernel_values_on_other_active_tokens():
    d, mask = _inputs()
    sat, ctl = sat_gate(d, mask), sat_gate(d, mask, shuffle=True)
    assert ctl.idx.numel() == sat.idx.numel() > 0
    assert torch.equal(ctl.psi.sort().values, sat.psi.sort().values) and torch.equal(ctl.q, sat.q)
    assert bool(mask.reshape(-1)[ctl.idx].all()) and torch.equal(ctl.gate.reshape(-1).nonzero().squeeze(1), ctl.idx)
    assert torch.equal(ctl.d, d.reshape(-1)[ctl.idx])  # the side follows the chosen token's own sign
    assert not torch.equal(ctl.idx, sat.idx)  # different tokens (the top tail is one specific set)
    # the gated set is not the top tail: most shuffled picks lie below the quantile
    assert float((d.reshape(-1)[ctl.idx].abs() <= sat.q).float().mean()) > 0.5


def test_shuffle_is_a_pure_function_of_its_inputs():
    d, mask = _inputs(seed=1)
    a, b = sat_gate(d, mask, shuffle=True), sat_gate(d.clone(), mask.clone(), shuffle=True)
    assert torch.equal(a.idx, b.idx)
    c = sat_gate(d + 1e-3, mask, shuffle=True)
    assert not torch.equal(a.idx, c.idx)  # new inputs, new draw


def test_shuffle_draws_roughly_uniformly():
    """Over many inputs every active position is picked about equally often (chi-square-free check)."""
    B, T, hits = 4, 25, torch.zeros(100)
    mask = torch.ones(B, T, dtype=torch.bool)
    for seed in range(400):
        d = torch.randn(B, T, generator=torch.Generator().manual_seed(seed))
        hits.index_add_(0, sat_gate(d, mask, shuffle=True).idx, torch.ones(10))
    expected = 400 * 10 / 100
    assert hits.min() > 0.4 * expected and hits.max() < 1.8 * expected


def test_shuffle_through_the_registry_and_exclusive_with_invert():
    spec = resolve_objective("sat_grpo", shuffle=True)
    assert spec.params["shuffle"] is True
    d, mask = _inputs(seed=2)
    d = torch.nan_to_num(d)
    logp = (-1.0 + 0.1 * torch.randn_like(d)).requires_grad_()
    kw = dict(logp=logp, behavior_logp=logp.detach() - d, adv=torch.randn(d.shape[0]), mask=mask)
    _, m_sat = policy_loss("sat_grpo", **kw)
    _, m_ctl = policy_loss("sat_grpo", shuffle=True, **kw)
    assert torch.equal(m_sat["gate_rate"], m_ctl["gate_rate"]) and not torch.equal(m_sat["tok/gate"], m_ctl["tok/gate"])
    with pytest.raises(ValueError, match="invert and shuffle"):
        policy_loss("sat_grpo", shuffle=True, invert=True, **kw)
