"""SAT's shuffle control: the same gate size and kernel values, moved to random active tokens."""

import pytest
import torch

from satrl.objectives import policy_loss, resolve_objective
from satrl.objectives.sat import sat_gate
from satrl.tensors import flat_nonzero


def gated(g) -> torch.Tensor:
    """Flat positions of the gated tokens."""
    return flat_nonzero(g.gate)


def _inputs(B=6, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = 0.3 * torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    d[~mask] = float("nan")  # padding garbage never matters
    return d, mask


def test_shuffle_keeps_count_and_kernel_values_on_other_active_tokens():
    d, mask = _inputs()
    sat, ctl = sat_gate(d, mask), sat_gate(d, mask, shuffle=True)
    idx, ctl_idx = gated(sat), gated(ctl)
    assert ctl_idx.numel() == idx.numel() > 0
    # the same multiset of kernel values (psi is 1 off the gate), on the gated slots only
    assert torch.equal(ctl.psi.reshape(-1).sort().values, sat.psi.reshape(-1).sort().values)
    assert torch.equal(ctl.q, sat.q)
    assert torch.equal(ctl.psi.reshape(-1)[ctl_idx].sort().values, sat.psi.reshape(-1)[idx].sort().values)
    assert torch.all(ctl.psi[~ctl.gate] == 1) and torch.all(ctl.psi[ctl.gate] < 0.5)
    assert bool(mask.reshape(-1)[ctl_idx].all())  # only active tokens are picked
    # the side follows the chosen token's own sign: its upper endpoint moves if d > 0, its lower if d < 0
    lo, hi = ctl.bounds(1.0, 0.2, 0.2)
    up, down = ctl.gate & (d > 0), ctl.gate & (d < 0)
    assert up.any() and down.any()
    assert torch.all(hi[up] < 1.2) and torch.all(lo[up] == 0.8)
    assert torch.all(lo[down] > 0.8) and torch.all(hi[down] == 1.2)
    assert torch.all(hi[~up] == 1.2) and torch.all(lo[~down] == 0.8)
    assert not torch.equal(ctl_idx, idx)  # different tokens (the top tail is one specific set)
    # the gated set is not the top tail: most shuffled picks lie below the quantile
    assert float((d.reshape(-1)[ctl_idx].abs() <= sat.q).float().mean()) > 0.5


def test_shuffle_is_a_pure_function_of_its_inputs():
    d, mask = _inputs(seed=1)
    a, b = sat_gate(d, mask, shuffle=True), sat_gate(d.clone(), mask.clone(), shuffle=True)
    assert torch.equal(a.gate, b.gate) and torch.equal(a.psi, b.psi)
    c = sat_gate(d + 1e-3, mask, shuffle=True)
    assert not torch.equal(a.gate, c.gate)  # new inputs, new draw


def test_shuffle_draws_roughly_uniformly():
    """Over many inputs every active position is picked about equally often (chi-square-free check)."""
    B, T, hits = 4, 25, torch.zeros(100)
    mask = torch.ones(B, T, dtype=torch.bool)
    for seed in range(400):
        d = torch.randn(B, T, generator=torch.Generator().manual_seed(seed))
        hits.index_add_(0, gated(sat_gate(d, mask, shuffle=True)), torch.ones(10))
    expected = 400 * 10 / 100
    assert hits.min() > 0.4 * expected and hits.max() < 1.8 * expected


def test_shuffle_through_the_registry_and_exclusive_with_invert():
    spec = resolve_objective("sat_grpo", shuffle=True)
    assert spec.trust_region.shuffle is True and resolve_objective("sat_grpo").trust_region.shuffle is False
    d, mask = _inputs(seed=2)
    d = torch.nan_to_num(d)
    logp = (-1.0 + 0.1 * torch.randn_like(d)).requires_grad_()
    kw = dict(logp=logp, behavior_logp=logp.detach() - d, adv=torch.randn(d.shape[0]), mask=mask)
    _, m_sat, t_sat = policy_loss("sat_grpo", **kw)
    _, m_ctl, t_ctl = policy_loss("sat_grpo", shuffle=True, **kw)
    assert torch.equal(m_sat["gate_rate"], m_ctl["gate_rate"]) and not torch.equal(t_sat.gate, t_ctl.gate)
    d_tok = (kw["logp"] - kw["behavior_logp"]).detach()  # the trust region's d (bits differ from d's)
    assert torch.equal(t_ctl.gate, sat_gate(d_tok, mask, shuffle=True).gate)  # the registry's control is sat_gate's
    with pytest.raises(ValueError, match="invert and shuffle"):
        policy_loss("sat_grpo", shuffle=True, invert=True, **kw)
