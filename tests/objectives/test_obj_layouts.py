"""Objectives do not depend on the memory layout of their inputs: a [B, T] tensor stored column-major (the
transpose of a contiguous [T, B], as a model's output can be after a permute) gives the same loss, gradient
and per-token metrics as the same values stored row-major. SAT writes at flat row-major positions, so a
layout-preserving allocation (``full_like``, ``zeros_like``) followed by ``view(-1)`` would fail or write to
the wrong tokens."""

import pytest
import torch

from satrl.objectives import policy_loss, sat_clip_bounds

PRESETS = ["grpo", "sat_grpo", "sat_gspo", "sat_cispo", "sat_gmpo", "sat_opsm", "gspo", "dppo_tv", "m2po"]
CONTROLS = {"plain": {}, "shuffle": {"shuffle": True}, "invert": {"invert": True}}  # SAT's controls
CASES = [(p, c) for p in PRESETS for c in (CONTROLS if p.startswith("sat_") else ["plain"])]


def colmajor(x: torch.Tensor) -> torch.Tensor:
    return x.T.contiguous().T  # same values, column-major strides


def inputs(seed: int = 0, b: int = 96, t: int = 1024):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3
    blp = logp + 0.1 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.2
    return logp, blp, adv, mask


@pytest.mark.parametrize("preset,control", CASES)
def test_column_major_inputs_give_the_same_results(preset, control):
    overrides = CONTROLS[control]
    logp, blp, adv, mask = inputs()
    row = logp.clone().requires_grad_()
    col = colmajor(logp).requires_grad_()
    assert not col.is_contiguous()
    a, ma, ta = policy_loss(preset, logp=row, behavior_logp=blp, adv=adv, mask=mask, **overrides)
    b, mb, tb = policy_loss(preset, logp=col, behavior_logp=colmajor(blp), adv=colmajor(adv), mask=colmajor(mask),
                        **overrides)  # fmt: skip
    a.sum().backward()
    b.sum().backward()
    assert torch.equal(a, b)
    assert torch.equal(row.grad, col.grad)
    for field in ("gate", "clipped", "d"):
        assert torch.equal(getattr(ta, field), getattr(tb, field)), field
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    if preset.startswith("sat_"):
        assert bool(ta.gate.any())  # the gate acted, so its writes were checked


def test_dense_bounds_with_column_major_input():
    logp, blp, _, mask = inputs(1)
    d = torch.where(mask, logp - blp, 0.0)
    lo, hi, m, gate = sat_clip_bounds(d, mask)
    lo2, hi2, m2, gate2 = sat_clip_bounds(colmajor(d), colmajor(mask))
    assert torch.equal(lo, lo2) and torch.equal(hi, hi2) and torch.equal(gate, gate2)
    assert all(torch.equal(m[k], m2[k]) for k in m)
    assert bool((hi < 1.2).any())
