"""Exact order statistics for SAT's quantile (paper Eq. 14): the k-th smallest entry of a flat tensor, and the
k-th smallest with the positions above it in one pass (the gate's candidates).

``quantile_rank`` turns alpha into the rank k = ceil(alpha * n) exactly; ``kth_smallest`` picks the k-th
smallest by numpy's introselect (CPU), a two-pass radix select (other devices) or ``kthvalue``, all equal
(tested); ``_kth_and_above`` brackets q with a strided sample so that one compare finds the candidates.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from satrl.tensors import flat_nonzero


def quantile_rank(alpha: float, n: int) -> int:
    """k = ceil(alpha * n), computed exactly (0.7 * 10 is 7, not 7.000000000000001)."""
    return math.ceil(Fraction(repr(float(alpha))) * n)


RADIX_MIN = 1 << 16  # below this many values, kthvalue is as fast and simpler


def kth_smallest(values: Tensor, k: int, method: str = "auto", nonneg: bool = False) -> Tensor:
    """The k-th smallest entry (1-based) of a flat tensor, as a 0-dim tensor; 0 when k < 1.

    An exact order statistic, never ``torch.quantile`` (which interpolates, so it is not Eq. 14's
    inverse-CDF convention, and refuses inputs above 16M elements). ``method``:
    - ``numpy``: numpy's introselect (``np.partition``) on a CPU copy, NaN last as in kthvalue; float16 and
      bfloat16 go through float32, which holds them exactly. Several times faster than the radix select on
      CPU (``python -m benchmarks.objectives`` prints both), and one copy of the input in memory.
    - ``radix``: float16/bfloat16/float32 only; two 16-bit histogram passes, no sort; the device-side choice.
    - ``kthvalue``: torch's own.
    - ``auto``: numpy for CPU inputs of at least ``RADIX_MIN`` entries, radix for larger float inputs on other
      devices, kthvalue otherwise.
    All return the same value (tested). ``nonneg=True`` promises no negative entries and no sign bit set,
    -0.0 included: true of ``abs`` outputs, NaN and +inf allowed), which saves the radix select a pass and
    a host sync.
    """
    n = values.numel()
    if k < 1 or n == 0:
        return values.new_zeros(())
    k = min(k, n)
    radix_ok = values.dtype in (torch.float32, torch.bfloat16, torch.float16)
    if method == "auto":
        if values.device.type == "cpu" and n >= RADIX_MIN:
            method = "numpy"
        else:
            method = "radix" if radix_ok and n >= RADIX_MIN else "kthvalue"
    if method == "numpy":
        flat = values.detach().reshape(-1)
        wide = flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat
        kth = np.partition(wide.cpu().numpy(), k - 1)[k - 1]
        return torch.tensor(kth, device=values.device).to(values.dtype)
    if method == "radix":
        if not radix_ok:
            raise ValueError(f"radix selection needs float16/bfloat16/float32 values, got {values.dtype}")
        return _radix_kth(values.reshape(-1).float(), k, nonneg).to(values.dtype)
    if method != "kthvalue":
        raise ValueError(f"unknown selection method {method!r}; valid choices: ['auto', 'kthvalue', 'numpy', 'radix']")
    return values.reshape(-1).kthvalue(k).values


def _radix_kth(x: Tensor, k: int, nonneg: bool = False) -> Tensor:
    """Exact k-th smallest of float32 ``x`` by two 16-bit histogram passes over order-preserving keys.

    key = bits ^ ((bits >> 31) & 0x7FFFFFFF) maps float32 to int32 monotonically (negatives included;
    NaN sorts last, as in kthvalue); for non-negative inputs (SAT's scores) the key is the bits
    themselves. Pass 1 counts the high 16 bits and finds the bucket holding the k-th key; pass 2
    counts the low 16 bits inside that bucket. Memory: about two int32 copies of ``x``.
    """
    key = x.view(torch.int32)
    if nonneg or not bool((key < 0).any()):  # no sign bit set (-0.0 has one: it takes the general path)
        return _radix_kth_nonneg(key, k)
    key = key ^ ((key >> 31) & 0x7FFFFFFF)
    high = (key >> 16) + (1 << 15)  # [0, 65536)
    b, r = _bucket(torch.bincount(high, minlength=1 << 16), k)
    low = torch.where(high == b, key & 0xFFFF, 1 << 16)  # outside the bucket: an extra, ignored bin
    del high
    j, _ = _bucket(torch.bincount(low, minlength=(1 << 16) + 1)[: 1 << 16], r)
    out = torch.tensor(((b - (1 << 15)) << 16) | j, dtype=torch.int64, device=x.device).to(torch.int32)
    out = out ^ ((out >> 31) & 0x7FFFFFFF)  # the key map is an involution
    return out.view(torch.float32)


def _radix_kth_nonneg(key: Tensor, k: int) -> Tensor:
    """:func:`_radix_kth` for keys >= 0 (the bits of non-negative floats): high 16 bits in [0, 32768).

    Pass 2 is key - bucket start clamped to [0, 65536]: keys below the bucket land in bin 0 with the
    bucket's own low-bits-0 keys and are subtracted back out (their number is known from pass 1),
    keys above it land in bin 65536; two elementwise passes instead of three.
    """
    b, r = _bucket(torch.bincount(key >> 16, minlength=1 << 15), k)
    low = torch.sub(key, b << 16).clamp_(0, 1 << 16)
    counts = torch.bincount(low, minlength=(1 << 16) + 1)[: 1 << 16]
    del low
    counts[0] -= k - r  # the keys below the bucket
    j, _ = _bucket(counts, r)
    return torch.tensor((b << 16) | j, dtype=torch.int32, device=key.device).view(torch.float32)


def _bucket(counts: Tensor, k: int) -> tuple[int, int]:
    """(index of the bin holding the k-th element, its rank inside that bin)."""
    cum = counts.cumsum(0)
    b = int(torch.searchsorted(cum, torch.tensor([k], device=cum.device, dtype=cum.dtype)).item())
    before = int(cum[b - 1].item()) if b > 0 else 0
    return b, k - before


SAMPLE = 1 << 15  # _kth_and_above: size of the strided sample that brackets q
MARGIN = 0.01  # ... and how far below q's rank (as a share of the entries) the bracket is put


def bracket_value(flat: Tensor, j: int, absolute: bool = False) -> Tensor:
    """The j-th smallest of the strided sample of ``SAMPLE`` entries of ``flat`` (of their ``abs`` with
    ``absolute``) that brackets q: numpy's introselect on CPU (several times faster than ``kthvalue`` at this
    size), ``kthvalue`` elsewhere; the same value either way (an order statistic)."""
    n = flat.numel()
    sample = flat[:: max(1, n // SAMPLE)][: min(n, SAMPLE)]
    sample = sample.abs() if absolute else sample
    return kth_smallest(sample, j, method="numpy" if flat.device.type == "cpu" else "kthvalue")


def _kth_and_above(s: Tensor, k: int, d: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(q, idx, d_g) for float32 scores ``s`` >= 0 (``abs`` outputs): q = the k-th smallest entry (as
    :func:`kth_smallest`), idx = the ascending flat positions with s > q (empty when q = 0) and, when the
    scores are ``|d|`` and ``d`` is given, d_g = d at idx (else None).

    One full pass instead of a selection over all scores plus the gate's compare: a strided
    sample of ``SAMPLE`` entries gives a value v whose rank is about ``MARGIN`` below q's; every entry
    not below v is a candidate (one compare and one ``nonzero``, the ``nonzero`` the gate needs anyway).
    The compare is on the bits as int32, which order non-negative floats as kthvalue does, NaN last (so
    NaN is a candidate), and is faster than the float compare plus its negation. If fewer than k
    entries lie below v, q is exactly the (k - below)-th smallest candidate and the gate is the
    candidates above it; otherwise (a sample that missed, e.g. adversarial data) the exact selection over
    all scores runs. Exact either way, and a pure function of ``s``.
    """
    flat = s.reshape(-1)
    n = flat.numel()
    j = int((k / n - MARGIN) * min(n, SAMPLE))
    if j >= 1:
        v = bracket_value(flat, j)
        cand = flat_nonzero(flat.view(torch.int32) >= v.view(torch.int32))
        below = n - cand.numel()
        if below < k:
            # With d, gather it at the candidates once: |d| there is the scores, and d at idx a small gather.
            d_c = None if d is None else d.reshape(-1).index_select(0, cand)
            cv = flat.index_select(0, cand) if d_c is None else d_c.abs()
            q = kth_smallest(cv, k - below, nonneg=True)
            if not bool(q > 0):
                return q, cand[:0], None if d_c is None else d_c[:0]
            # float compare: NaN is never gated, as s > q. nonzero + gather: faster than masked_select.
            sel = flat_nonzero(cv > q)
            return q, cand.index_select(0, sel), None if d_c is None else d_c.index_select(0, sel)
    q = kth_smallest(flat, k, nonneg=True)
    if not bool(q > 0):
        return q, torch.zeros(0, dtype=torch.int64, device=s.device), None
    return q, flat_nonzero(flat > q), None
