"""SAT's fast selection paths (large float32 inputs) equal the plain ones bit for bit.

``sat_gate(..., zero_masked=True)`` (what the trust regions use: scores are |d|, exactly 0 on masked
positions) ranks without the +inf fill and finds q and the gated positions from one histogram pass and
one ``nonzero``; ``kth_smallest(..., nonneg=True)`` skips the sign check. Sizes are above RADIX_MIN so
that the radix paths run.
"""

import pytest
import torch

from satrl.objectives import RATIO_LEVELS, aggregate, clipped_surrogate, policy_loss, sat_clip_bounds
from satrl.objectives.sat import RADIX_MIN, kth_smallest, sat_gate


def scores(seed: int, kind: str, b: int = 96, t: int = 1024):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[5] = False
    if kind == "normal":
        d = torch.randn(b, t, generator=g) * 0.05
    elif kind == "ties":  # few distinct values: q is tied with many tokens, which must not be gated
        d = torch.randint(-3, 4, (b, t), generator=g).float() / 8
    elif kind == "mostly_zero":  # q = 0: nothing is gated
        d = torch.zeros(b, t)
        d[0, :10] = 0.3
    else:  # "per_sequence": GSPO's broadcast sequence log-ratio
        d = (torch.randn(b, 1, generator=g) * 0.05).expand(b, t).clone()
    return torch.where(mask, d, 0.0), mask


@pytest.mark.parametrize("kind", ["normal", "ties", "mostly_zero", "per_sequence"])
@pytest.mark.parametrize("alpha", [0.9, 0.5, 0.999])
def test_zero_masked_gate_equals_the_plain_gate(kind, alpha):
    d, mask = scores(0, kind)
    assert d.numel() >= RADIX_MIN
    fast, plain = sat_gate(d, mask, alpha, zero_masked=True), sat_gate(d, mask, alpha)
    assert torch.equal(fast.q, plain.q) and torch.equal(fast.idx, plain.idx)
    assert torch.equal(fast.gate, plain.gate) and torch.equal(fast.psi, plain.psi) and fast.n == plain.n
    assert fast.idx.numel() <= int(mask.sum()) * (1 - alpha) + 1
    if kind == "mostly_zero":
        assert float(fast.q) == 0.0 and fast.idx.numel() == 0
    elif kind == "normal":
        assert fast.idx.numel() > 0
    if kind == "ties":
        assert (d.abs() == fast.q).sum() > fast.idx.numel()  # many ties at q, none gated


@pytest.mark.parametrize("invert", [False, True])
def test_zero_masked_is_the_same_for_the_inverted_gate_and_a_score(invert):
    d, mask = scores(1, "normal")
    score = torch.where(mask, (d * 3).abs(), 0.0)
    for sc in (None, score):
        a = sat_gate(d, mask, 0.8, invert=invert, score=sc, zero_masked=True)
        b = sat_gate(d, mask, 0.8, invert=invert, score=sc)
        assert torch.equal(a.q, b.q) and torch.equal(a.idx, b.idx) and torch.equal(a.psi, b.psi)


@pytest.mark.parametrize("n", [RADIX_MIN, 3 * RADIX_MIN + 7])
def test_nonneg_radix_equals_kthvalue(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).abs()
    x[::7] = 0.0
    x[3] = float("inf")
    for k in (1, n // 3, n - 1, n):
        want = torch.sort(x).values[k - 1]
        assert kth_smallest(x, k, "radix", nonneg=True) == kth_smallest(x, k, "kthvalue") == want
        assert kth_smallest(x, k, "numpy") == want


def test_negative_zero_takes_the_signed_path():
    x = torch.rand(RADIX_MIN)
    x[:10] = -0.0  # sign bit set: the non-negative fast path would misread these keys
    for k in (1, 10, 11, RADIX_MIN):
        assert kth_smallest(x, k, "radix") == torch.sort(x).values[k - 1] == kth_smallest(x, k, "numpy")


@pytest.mark.parametrize("preset,ratio", [("sat_grpo", "token"), ("sat_gspo", "sequence")])
def test_large_sat_loss_equals_the_dense_bounds(preset, ratio):
    """At trainer size the fast path's loss and gradient are clipped_surrogate with sat_clip_bounds'
    dense bounds (which take the plain path)."""
    g = torch.Generator().manual_seed(2)
    b, t = 64, 1024
    logp = -torch.rand(b, t, generator=g) * 3
    blp = logp + 0.05 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.2
    adv = torch.randn(b, generator=g)
    lp = logp.clone().requires_grad_()
    loss, m = policy_loss(preset, logp=lp, behavior_logp=blp, adv=adv, mask=mask)
    (grad,) = torch.autograd.grad(aggregate(loss, mask, "token-mean"), lp)
    lp2 = logp.clone().requires_grad_()
    ratio_t, d = RATIO_LEVELS.get(ratio).fn(lp2, blp, mask)
    lo, hi, ref_m = sat_clip_bounds(d, mask)
    ref = torch.where(mask, clipped_surrogate(ratio_t, adv[:, None], lo, hi), 0.0)
    (ref_grad,) = torch.autograd.grad(aggregate(ref, mask, "token-mean"), lp2)
    assert float(m["gate_rate"]) > 0.05
    assert torch.equal(m["tok/gate"], ref_m["tok/gate"]) and torch.equal(m["q"], ref_m["q"])
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=0, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)


@pytest.mark.parametrize("with_d", [False, True])
@pytest.mark.parametrize("case", ["sample_misses", "rank_below_margin", "nan_on_active", "many_nan"])
def test_bracket_fallbacks_are_exact(case, with_d):
    """_kth_and_above's sampled bracket can miss (strided sample sees only large values), be unusable
    (q's rank within MARGIN of the bottom), or meet NaN (sorts last, never gated; enough NaN to move q's
    rank): same q and gate, and with ``d`` the same d at the gated positions."""
    from satrl.objectives.sat import SAMPLE, _kth_and_above

    n = 4 * SAMPLE
    g = torch.Generator().manual_seed(3)
    s = torch.rand(n, generator=g) * 1e-3
    k = int(0.9 * n)
    if case == "sample_misses":
        s[:: n // SAMPLE] = 1.0 + torch.rand(SAMPLE, generator=g)  # every sampled entry is large
    elif case == "rank_below_margin":
        k = 5
    elif case == "many_nan":
        s[torch.randperm(n, generator=g)[: n // 20]] = float("nan")  # 5 %: a NaN-blind count would move q
    else:
        s[7] = float("nan")
        s[11] = float("inf")
    d = s * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0) if with_d else None
    q, idx, d_g = _kth_and_above(s, k, d)
    want = torch.sort(s).values[k - 1]  # NaN sorts last, as kthvalue
    assert torch.equal(q, want)
    assert torch.equal(idx, (s > want).nonzero().squeeze(1))
    if with_d and case not in ("sample_misses", "rank_below_margin"):
        assert torch.equal(d_g, d[idx])  # the bracket's path gathers d at the candidates
    elif d_g is not None:
        assert torch.equal(d_g, d[idx])


@pytest.mark.parametrize("kind", ["sparse", "empty", "full", "strided_2d"])
def test_flat_nonzero_equals_torch(kind):
    """satrl.tensors.flat_nonzero (numpy's flatnonzero on CPU) gives torch's positions and dtype."""
    from satrl.tensors import flat_nonzero

    g = torch.Generator().manual_seed(0)
    flag = torch.rand(300, 257, generator=g) > 0.9
    if kind == "empty":
        flag = torch.zeros_like(flag)
    elif kind == "full":
        flag = torch.ones_like(flag)
    elif kind == "strided_2d":
        flag = flag[:, ::3]  # not contiguous
    got = flat_nonzero(flag)
    want = flag.reshape(-1).nonzero().squeeze(1)
    assert got.dtype == torch.int64 and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_numpy_selection_equals_kthvalue_in_every_dtype(dtype):
    """kth_smallest's numpy path (the CPU default at RADIX_MIN entries and above): the same value and dtype as
    torch.kthvalue, NaN sorting last, with ties and infinities."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(RADIX_MIN + 11, generator=g) * 3).round().to(dtype)  # many ties
    x[5], x[9], x[13] = float("nan"), float("inf"), -float("inf")
    n = x.numel()
    for k in (1, 2, n // 2, n - 1, n):
        got = kth_smallest(x, k, "numpy")
        want = x.kthvalue(k).values
        assert got.dtype == dtype and got.shape == ()
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert kth_smallest(x, n, "auto").isnan()  # auto takes the numpy path on CPU: NaN is the largest
