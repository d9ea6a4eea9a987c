"""The clipped surrogate's written-out gradient (``trust_regions._Surrogate``) equals autograd's through
:func:`clipped_surrogate`, bit for bit: random ratios, exact ties at every bound, the dual clip, [B, 1] and
[B, T] advantages, float32/bfloat16/float64. The one difference is by design: where r lies outside a bound
but the two branches' products round to the same value (common in bfloat16, within an ulp of a bound in
float32), autograd's ``maximum``/``minimum`` splits the gradient in half; the written-out gradient keeps
the branch that is larger in exact arithmetic (all of -A, or 0). And a sparse override gives its constant
value with zero gradient there and leaves every other token as it was."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.objectives import clipped_surrogate
from satrl.objectives.trust_regions import _clip
from satrl.tensors import clean_adv

LO, HI, DUAL = 0.8, 1.2, 3.0


def inputs(seed: int, dtype: torch.dtype, adv_kind: str, ties: bool, b: int = 6, t: int = 40):
    g = torch.Generator().manual_seed(seed)
    ratio = torch.exp(torch.randn(b, t, generator=g, dtype=torch.float64) * 0.6).to(dtype)
    if ties:  # exact ties with lo, hi, 1 and the dual clip (maximum/minimum split the gradient there)
        flat = ratio.view(-1)
        for j, v in enumerate((LO, HI, 1.0, DUAL)):
            flat[j::7] = torch.tensor(v, dtype=dtype)
    mask = torch.rand(b, t, generator=g) > 0.2
    adv = torch.randn(b if adv_kind == "row" else (b, t), generator=g, dtype=torch.float64).to(dtype)
    if ties and adv_kind == "token":
        adv.view(-1)[3::11] = 0.0
    return ratio, clean_adv(adv, mask), mask


def rounding_ties(ratio, adv, dual):
    """Tokens where r is past a bound (or the dual clip) but the branches' products are equal after
    rounding: autograd splits the gradient there."""
    na = -adv
    a, b = ratio * na, torch.clamp(ratio, LO, HI) * na
    tie = ((ratio > HI) | (ratio < LO)) & (a == b) & (na != 0)
    if dual is not None:
        tie |= (adv < 0) & (torch.maximum(a, b) == DUAL * na) & (ratio != DUAL)
    return tie


def both(ratio, adv, mask, dual, override=None):
    r1 = ratio.clone().requires_grad_()
    r2 = ratio.clone().requires_grad_()
    ref = clipped_surrogate(r1, adv, LO, HI, dual)
    got, clipped, _ = _clip(r2, adv, mask, LO, HI, dual, override)
    w = torch.linspace(0.5, 1.5, ratio.numel(), dtype=ratio.dtype).view_as(ratio)  # a non-uniform upstream
    (ref * w).sum().backward()
    (got * w).sum().backward()
    return ref.detach(), r1.grad, got.detach(), r2.grad, clipped


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
       adv_kind=st.sampled_from(["row", "token"]), ties=st.booleans(), dual=st.sampled_from([None, DUAL]))
def test_gradient_equals_autograd_bit_for_bit(seed, dtype, adv_kind, ties, dual):
    ratio, adv, mask = inputs(seed, dtype, adv_kind, ties)
    ref, ref_grad, got, grad, _ = both(ratio, adv, mask, dual)
    assert torch.equal(got, ref)
    assert grad.dtype == ref_grad.dtype
    tie = rounding_ties(ratio, adv.expand_as(ratio), dual)
    assert torch.equal(grad[~tie], ref_grad[~tie])
    if dtype == torch.float64:
        assert not bool(tie.any())
    # on rounding ties autograd passes half of the gradient of the branch it keeps; this passes all or none
    full = 2 * ref_grad[tie]
    assert bool(((grad[tie] == full) | (grad[tie] == 0)).all())


def test_rounding_ties_are_exercised_in_bfloat16():
    """bfloat16 products tie often enough that the test above meets them (so its tie branch is not dead)."""
    found = 0
    for seed in range(20):
        ratio, adv, _ = inputs(seed, torch.bfloat16, "token", False)
        found += int(rounding_ties(ratio, adv, None).sum())
    assert found > 0


@pytest.mark.parametrize("dual", [None, DUAL])
def test_ties_are_really_exercised(dual):
    """The tie rows hit each bound exactly, so the test above sees maximum's and minimum's split gradient."""
    ratio, adv, _ = inputs(0, torch.float32, "token", True)
    for v in (LO, HI, DUAL):
        assert bool((ratio == torch.tensor(v)).any())


def test_sparse_override_is_constant_with_zero_gradient():
    ratio, adv, mask = inputs(1, torch.float32, "row", False)
    pos = torch.tensor([0, 5, 17, 100, 239])
    value = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5])
    ref, ref_grad, got, grad, clipped = both(ratio, adv, mask, None, (pos, value))
    keep = torch.ones(ratio.numel(), dtype=torch.bool)
    keep[pos] = False
    assert torch.equal(got.view(-1)[pos], value)
    assert torch.equal(grad.view(-1)[pos], torch.zeros(5))
    assert bool(clipped.view(-1)[pos].all())
    assert torch.equal(got.view(-1)[keep], ref.view(-1)[keep])
    assert torch.equal(grad.view(-1)[keep], ref_grad.view(-1)[keep])
