"""SAT's one dense path at trainer-like sizes: the order statistic, the gate and the kernel equal the formulas
written out in plain Python (tests/objectives/objectives_naive.py's ``kth``), and the registered ``sat`` trust
region equals the naive per-token loop; the selection is exact (NaN, ties, signed zeros, every dtype, a device
``k``). That the path takes no host sync is test_obj_no_host_sync.py's."""

import math

import pytest
import torch
from objectives_naive import kth, naive_policy_loss

from satrl.objectives import RATIO_LEVELS, aggregate, clipped_surrogate, policy_loss, sat_clip_bounds
from satrl.objectives.sat import kth_smallest, sat_gate

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def scores(seed: int, kind: str, b: int = 64, t: int = 256):
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


def naive_gate(s: list[float], alpha: float, exponent: float, invert: bool) -> tuple[float, list[bool], list[float]]:
    """(q, gate, psi) over the active scores ``s``, from the formulas in sat.py's docstring, in Python floats."""
    n = len(s)
    if invert:  # the bottom tail, same budget m = n - ceil(alpha n): q_lo is the (m+1)-th smallest
        m = n - math.ceil(round(alpha * n, 9))
        q = sorted(s)[m] if m > 0 else 0.0
        gate = [v < q for v in s]
        psi = [(1.0 / (1.0 + (q / v) ** exponent) if v > 0 else 0.0) if g else 1.0 for v, g in zip(s, gate)]
    else:
        q = kth(s, alpha)
        gate = [q > 0 and v > q for v in s]
        psi = [1.0 / (1.0 + (v / q) ** exponent) if g else 1.0 for v, g in zip(s, gate)]
    return q, gate, psi


def check_against_naive(g, s: torch.Tensor, mask: torch.Tensor, alpha, exponent=2.0, invert=False):
    q, gate, psi = naive_gate(s[mask].double().tolist(), alpha, exponent, invert)
    assert float(g.q) == pytest.approx(q, rel=0, abs=0)  # the same float32 entry, not an interpolation
    assert g.gate[mask].tolist() == gate and not g.gate[~mask].any()
    torch.testing.assert_close(g.psi[mask].double(), torch.tensor(psi, dtype=torch.float64), rtol=1e-6, atol=0)
    assert torch.all(g.psi[~mask] == 1) and float(g.n) == int(mask.sum())


@pytest.mark.parametrize("kind", ["normal", "ties", "mostly_zero", "per_sequence"])
@pytest.mark.parametrize("alpha", [0.9, 0.5, 0.999])
def test_dense_gate_equals_the_naive_formula(kind, alpha):
    d, mask = scores(0, kind)
    g = sat_gate(d, mask, alpha)
    check_against_naive(g, d.abs(), mask, alpha)
    gated = int(g.gate.sum())
    assert gated <= int(mask.sum()) * (1 - alpha) + 1
    if kind == "mostly_zero":
        assert float(g.q) == 0.0 and gated == 0
    elif kind == "normal":
        assert gated > 0
    if kind == "ties":
        assert int(((d.abs() == g.q) & mask).sum()) > gated  # many ties at q, none of them gated


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("exponent", [2.0, 1.0])
def test_inverted_gate_and_a_score_equal_the_naive_formula(invert, exponent):
    d, mask = scores(1, "normal")
    score = torch.where(mask, (d * 3).abs() + 1e-3, 0.0)  # a proxy: its own quantile, psi on score / q
    for sc in (None, score):
        g = sat_gate(d, mask, 0.8, exponent, invert=invert, score=sc)
        check_against_naive(g, d.abs() if sc is None else sc, mask, 0.8, exponent, invert)
        assert int(g.gate.sum()) > 0


@pytest.mark.parametrize("invert", [False, True])
def test_masked_garbage_does_not_move_the_gate(invert):
    d, mask = scores(2, "normal")
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])
    dirty = torch.where(mask, d, junk[torch.arange(d.numel()).reshape(d.shape) % 4])
    a, b = sat_gate(d, mask, 0.9, invert=invert), sat_gate(dirty, mask, 0.9, invert=invert)
    assert torch.equal(a.q, b.q) and torch.equal(a.gate, b.gate) and torch.equal(a.psi, b.psi)
    assert torch.equal(a.n, b.n)


def test_nan_on_an_active_token_sorts_last_and_is_never_gated():
    d, mask = scores(3, "normal")
    flat_active = mask.reshape(-1).nonzero().squeeze(1)
    nan_at = flat_active[:: 10]  # 10 % of the active tokens: enough to move q's rank
    d.view(-1)[nan_at] = float("nan")
    g = sat_gate(d, mask, 0.8)
    values = d.abs()[mask].tolist()
    k = math.ceil(round(0.8 * len(values), 9))
    ordered = sorted(v for v in values if not math.isnan(v)) + [v for v in values if math.isnan(v)]
    assert float(g.q) == ordered[k - 1]  # NaN counts in n and sorts last, as kthvalue
    assert not g.gate.reshape(-1)[nan_at].any()


@pytest.mark.parametrize("preset", ["sat_grpo", "sat_gspo"])
def test_registered_sat_trust_region_equals_the_naive_loop(preset):
    """The trainer's path (policy_loss -> the registered ``sat`` trust region) at a size where the gate picks
    dozens of tokens, values and gradients, against the per-token Python loop."""
    g = torch.Generator().manual_seed(4)
    b, t = 12, 40
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    # a per-response drift and token noise: gated tokens (and, under GSPO, sequences) inside PPO's interval
    blp = logp + 0.08 * torch.randn(b, 1, generator=g, dtype=torch.float64)
    blp = blp + 0.08 * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) > 0.2
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    for alpha in (0.9, 0.7):
        lp1 = logp.clone().requires_grad_()
        loss, m, tok = policy_loss(preset, logp=lp1, behavior_logp=blp, adv=adv, mask=mask, alpha=alpha)
        (g1,) = torch.autograd.grad(loss.sum(), lp1)
        lp2 = logp.clone().requires_grad_()
        ref_tok, total = naive_policy_loss(preset, lp2, blp, adv, mask, alpha=alpha)
        (g2,) = torch.autograd.grad(total, lp2)
        assert int(tok.gate.sum()) >= 30
        assert float(m["sat_clipfrac"]) > 0  # SAT changed some gradients, so the comparison bites
        torch.testing.assert_close(loss.detach(), ref_tok, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("preset,ratio", [("sat_grpo", "token"), ("sat_gspo", "sequence")])
def test_large_sat_loss_equals_the_public_bounds(preset, ratio):
    """At trainer size the registered trust region's loss and gradient are clipped_surrogate with
    sat_clip_bounds' bounds, bit for bit, and its gate is sat_clip_bounds' gate."""
    g = torch.Generator().manual_seed(2)
    b, t = 64, 1024
    logp = -torch.rand(b, t, generator=g) * 3
    blp = logp + 0.05 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.2
    adv = torch.randn(b, generator=g)
    lp = logp.clone().requires_grad_()
    loss, m, tok = policy_loss(preset, logp=lp, behavior_logp=blp, adv=adv, mask=mask)
    (grad,) = torch.autograd.grad(aggregate(loss, mask, "token-mean"), lp)
    lp2 = logp.clone().requires_grad_()
    ratio_t, d = RATIO_LEVELS.get(ratio).fn(lp2, blp, mask)
    lo, hi, ref_m, ref_gate = sat_clip_bounds(d, mask)
    ref = torch.where(mask, clipped_surrogate(ratio_t, adv[:, None], lo, hi), 0.0)
    (ref_grad,) = torch.autograd.grad(aggregate(ref, mask, "token-mean"), lp2)
    assert float(m["gate_rate"]) > 0.05
    assert torch.equal(tok.gate, ref_gate) and torch.equal(m["q"], ref_m["q"])
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=0, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_kth_smallest_with_a_device_k_and_out_of_range_k(device):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(7, 33, generator=g) * 3).round().to(device)  # 2-D (flattened), many ties
    x[0, 1], x[2, 3] = float("nan"), -float("inf")
    n = x.numel()
    for k in (1, 2, n // 2, n - 1, n):
        for kk in (k, torch.tensor(k, device=device)):
            got = kth_smallest(x, kk)
            assert got.device == x.device and got.shape == ()
            torch.testing.assert_close(got, x.reshape(-1).kthvalue(k).values, rtol=0, atol=0, equal_nan=True)
    assert kth_smallest(x, n).isnan() and kth_smallest(x, 1) == -float("inf")  # NaN is the largest
    for k in (0, -3, torch.tensor(0, device=device), torch.tensor(-3, device=device)):
        got = kth_smallest(x, k)
        assert got.device == x.device and got.shape == () and float(got) == 0.0  # k < 1: 0 (the gate is off)
    assert float(kth_smallest(torch.empty(0, device=device), 3)) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_kth_smallest_equals_kthvalue_in_every_dtype(dtype):
    """The same value and dtype as torch.kthvalue, NaN sorting last, with ties, infinities and signed zeros."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5000, generator=g) * 3).round().to(dtype)  # many ties
    x[5], x[9], x[13], x[17] = float("nan"), float("inf"), -float("inf"), -0.0
    n = x.numel()
    for k in (1, 2, n // 2, n - 1, n):
        got = kth_smallest(x, k)
        assert got.dtype == dtype and got.shape == ()
        torch.testing.assert_close(got, x.kthvalue(k).values, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kind", ["sparse", "empty", "full", "strided_2d"])
def test_flat_nonzero_equals_torch(kind):
    """satrl.tensors.flat_nonzero gives torch's flat positions and dtype, for any layout."""
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
