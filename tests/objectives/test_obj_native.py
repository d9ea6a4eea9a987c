"""SAT's compiled loops (``satrl.objectives.native``) equal the torch path bit for bit: loss, gradient, every
metric and every per-token map, for the AVX2 and the scalar loops, on the inputs where they differ in code
(row-straddling blocks, per-token advantages, NaN and inf, ties, a missed bracket, no gate at all).

A machine with a C compiler must build them (the test fails if the build does); the fallback without one
is tested by hiding the compiler.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from satrl.objectives import aggregate, native, policy_loss
from satrl.objectives import sat as sat_mod
from satrl.objectives.selection import RADIX_MIN, SAMPLE

HAVE_CC = native._compiler() is not None


@pytest.fixture(autouse=True)
def _native_on(monkeypatch):
    native.set_enabled(True)
    monkeypatch.setitem(native._state, "scalar_ok", True)  # the scalar loops run where a test forces them
    yield
    native.set_enabled(True)
    if native.library() is not None:
        native.library().sat_force_scalar(0)


def lib_or_fail():
    if not HAVE_CC:
        pytest.skip("no C compiler on PATH: the torch path runs (tested in test_no_compiler_falls_back)")
    lib = native.library()
    assert lib is not None, f"a C compiler is present but the SAT loops did not build: {native.status()}"
    return lib


def inputs(seed, b, t, *, adv_per_token=False, mask_p=0.3, scale=0.05, special=None):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3.0
    blp = logp + scale * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > mask_p
    if special == "nan_inf":  # garbage on masked positions, NaN and inf on active ones
        blp[~mask] = float("nan")
        act = mask.nonzero()
        blp[act[0, 0], act[0, 1]] = float("nan")
        logp[act[1, 0], act[1, 1]] = float("-inf")
        blp[act[2, 0], act[2, 1]] = float("inf")
    elif special == "ties":  # few distinct |d|: many tokens tied with q, none of them gated
        blp = logp + torch.randint(-3, 4, (b, t), generator=g).float() / 64
    elif special == "mostly_zero":  # q = 0: nothing is gated
        blp = logp.clone()
        blp[0, :10] += 0.3
    elif special == "bracket_misses":  # every sampled entry is large: the bracket misses, full selection
        blp.view(-1)[:: max(1, b * t // SAMPLE)] += 2.0
    adv = torch.randn(b, t, generator=g) if adv_per_token else torch.randn(b, generator=g)
    if special == "zero_adv":
        adv[: b // 2] = 0.0
    return {"logp": logp.requires_grad_(), "behavior_logp": blp, "adv": adv, "mask": mask}


def run(x, preset="sat_grpo", **kw):
    x["logp"].grad = None
    loss, metrics = policy_loss(preset, **x, **kw)
    aggregate(loss, x["mask"], "token-mean").backward()
    return loss.detach(), metrics, x["logp"].grad.clone()


def same(a, b) -> bool:
    """Equal bit for bit (so +0 and -0 differ), NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(((a.view(ints) == b.view(ints)) | (a.isnan() & b.isnan())).all())


def assert_same_both_paths(x, preset="sat_grpo", **kw):
    calls = []
    original = native.gate_fixup

    def spy(*a, **k):
        calls.append(1)
        return original(*a, **k)

    native.gate_fixup = spy
    try:
        fast = run(x, preset, **kw)
    finally:
        native.gate_fixup = original
    native.set_enabled(False)
    ref = run(x, preset, **kw)
    native.set_enabled(True)
    assert calls, "the compiled loops did not run"
    assert same(fast[0], ref[0]), "loss"
    assert same(fast[2], ref[2]), "gradient"
    assert set(fast[1]) == set(ref[1])
    for k in ref[1]:
        assert same(fast[1][k], ref[1][k]), k
    return ref[1]


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize(
    "b,t,kw",
    [
        (96, 1024, {}),
        (96, 1000, {"adv_per_token": True}),  # T not a multiple of 8: vector blocks straddle rows
        (70, 1001, {}),
        (21846, 3, {}),  # T < 8: every block straddles rows
        (64, 1024, {"special": "nan_inf"}),
        (64, 1024, {"special": "ties"}),
        (64, 1024, {"special": "mostly_zero"}),
        (128, 1024, {"special": "bracket_misses"}),  # 4 * SAMPLE tokens: a quarter is large, all sampled
        (64, 1024, {"special": "zero_adv", "adv_per_token": True}),
        (64, 1024, {"mask_p": 0.0, "scale": 0.3}),
    ],
)
def test_compiled_equals_torch(scalar, b, t, kw):
    lib = lib_or_fail()
    lib.sat_force_scalar(int(scalar))
    x = inputs(0, b, t, **kw)
    assert x["logp"].numel() >= RADIX_MIN
    passes = []
    original = native.candidates
    native.candidates = lambda *a, **k: passes.append(1) or original(*a, **k)
    try:
        m = assert_same_both_paths(x)
    finally:
        native.candidates = original
    special = kw.get("special")
    assert len(passes) == (2 if special == "bracket_misses" else 1)  # a missed bracket: the exact fallback
    if special == "mostly_zero":
        assert float(m["q"]) == 0.0 and float(m["gate_rate"]) == 0.0
    elif special != "ties":
        assert float(m["gate_rate"]) > 0.05
    if special in (None, "nan_inf", "zero_adv") and "scale" not in kw:  # q inside PPO's radius: SAT acts
        assert float(m["sat_clipfrac"]) > 0.0


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("kw", [{"eps_low": 0.15, "eps_high": 0.28}, {"dual_clip": 3.0}, {"alpha": 0.5},
                                {"alpha": 0.999}, {"eps_low": 0.0, "eps_high": 0.0}])  # fmt: skip
def test_compiled_equals_torch_for_other_parameters(scalar, kw):
    lib_or_fail().sat_force_scalar(int(scalar))
    assert_same_both_paths(inputs(1, 80, 1024), **kw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    t=st.sampled_from([1, 7, 8, 9, 255, 1024]),
    scale=st.sampled_from([1e-4, 0.05, 1.0]),
    eps=st.sampled_from([0.1, 0.2, 0.2000001, 0.28]),
    per_token=st.booleans(),
    scalar=st.booleans(),
)
def test_compiled_equals_torch_property(seed, t, scale, eps, per_token, scalar):
    """Random shapes, scales (q far inside or outside the radius) and radii whose float32 rounding matters."""
    lib_or_fail().sat_force_scalar(int(scalar))
    b = -(-RADIX_MIN // t)
    assert_same_both_paths(inputs(seed, b, t, adv_per_token=per_token, scale=scale), eps_low=eps, eps_high=eps)


def test_torch_path_where_the_loops_do_not_apply():
    """Controls, proxies, other dtypes and small inputs take the torch path: the loops are never called."""
    lib_or_fail()
    calls = []
    original = native.gate_fixup
    native.gate_fixup = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        x = inputs(2, 80, 1024)
        for kw in ({"shuffle": True}, {"invert": True}, {"proxy": "prob_diff"}, {"exponent": 3.0}):
            run(x, **kw)
        x64 = {k: (v.detach().double() if v.is_floating_point() else v) for k, v in x.items()}
        run({**x64, "logp": x64["logp"].requires_grad_()})  # float64
        run(inputs(2, 8, 64))  # below RADIX_MIN
        run(x, "sat_gspo")  # GSPO's d is per sequence, still |d|: the loops apply
    finally:
        native.gate_fixup = original
    assert len(calls) == 1


def test_no_compiler_falls_back(monkeypatch, tmp_path):
    """Without a compiler the torch path runs, the status says why, and results are unchanged."""
    x = inputs(4, 80, 1024)
    want = run(x)
    monkeypatch.setattr(native, "_compiler", lambda: None)
    monkeypatch.setattr(native, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(native, "_state", {**native._state, "lib": None, "tried": False, "reason": ""})
    assert native.library() is None
    assert "no C compiler" in native.status()
    got = run(x)
    assert same(got[0], want[0]) and same(got[2], want[2])
    assert all(same(got[1][k], want[1][k]) for k in want[1])


def test_without_avx2_the_torch_path_runs(monkeypatch):
    """The scalar loops are slower than the torch path, so a CPU without AVX2 runs the torch path."""
    lib_or_fail()
    monkeypatch.setitem(native._state, "avx2", False)
    monkeypatch.setitem(native._state, "scalar_ok", False)
    assert not native.active() and "no AVX2" in native.status()
    calls = []
    original = native.gate_fixup
    monkeypatch.setattr(native, "gate_fixup", lambda *a, **k: calls.append(1) or original(*a, **k))
    run(inputs(6, 80, 1024))
    assert not calls


def test_build_is_cached_and_atomic(monkeypatch, tmp_path):
    """The library is built once into the cache dir, under a name keyed by the source; no partial files."""
    if not HAVE_CC:
        pytest.skip("no C compiler on PATH")
    monkeypatch.setattr(native, "cache_dir", lambda: tmp_path)
    lib = native._build()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("sat_kernels-") and files[0].endswith(".so")
    assert lib.sat_kernel_isa() in (0, 1)
    mtime = (tmp_path / files[0]).stat().st_mtime_ns
    native._build()
    assert (tmp_path / files[0]).stat().st_mtime_ns == mtime  # not rebuilt


def test_sat_metrics_split_is_unchanged():
    """sat_metrics through _table10: the mean effective radii equal the dense bounds' means, and c_min their
    strongest contraction (a wrong side or a dropped deficit term fails)."""
    d = torch.randn(50, 300, generator=torch.Generator().manual_seed(5)) * 0.05
    mask = torch.rand(50, 300, generator=torch.Generator().manual_seed(6)) > 0.2
    d = torch.where(mask, d, 0.0)
    lo, hi, m = sat_mod.sat_clip_bounds(d, mask, eps_low=0.2, eps_high=0.3)
    assert torch.allclose(m["eps_high_mean"], (hi - 1.0)[mask].mean(), atol=1e-6)
    assert torch.allclose(m["eps_low_mean"], (1.0 - lo)[mask].mean(), atol=1e-6)
    c = torch.minimum((hi - 1.0) / 0.3, (1.0 - lo) / 0.2)[mask]
    assert float(m["eps_high_mean"]) < 0.3 and float(m["eps_low_mean"]) < 0.2
    assert torch.allclose(m["c_min"], c.min(), atol=1e-6)


def test_the_c_source_ships_with_the_package():
    """pyproject's package-data names the C file, so a wheel (not only an editable install) can build it."""
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["satrl"]
    rel = native.SOURCE.resolve().relative_to(root / "src" / "satrl").as_posix()
    assert any(fnmatch.fnmatch(rel, p) for p in patterns), (rel, patterns)


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("preset", ["sat_gspo", "sat_grpo_tis", "sat_opsm"])
def test_compiled_equals_torch_for_other_sat_presets(scalar, preset):
    """GSPO's per-sequence d (no |d| from the caller: the bracket ranks the sample's abs) and SAT under a
    correction take the loops too, with the same results."""
    lib_or_fail().sat_force_scalar(int(scalar))
    assert_same_both_paths(inputs(7, 80, 1024), preset)
