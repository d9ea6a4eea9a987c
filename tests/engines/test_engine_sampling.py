"""The sampling maths alone: truncation against a naive reference, and chi-square tests that the
inverse-CDF sampler draws from softmax(truncate(logits / T))."""

from __future__ import annotations

import torch
from engine_helpers import chi2_critical, chi2_stat, ref_logprobs
from hypothesis import given, settings
from hypothesis import strategies as st

from satrl.engines import request_uniforms, sample_step, sampling_logprobs
from satrl.types import SamplingParams

# Upper 0.001 critical values of chi-square from standard tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4).
CHI2_TABLE_001 = {2: 13.816, 4: 18.467, 7: 24.322, 10: 29.588, 20: 45.315, 30: 59.703}

LOGITS = torch.log(torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02]))  # V = 8


def test_wilson_hilferty_matches_tables():
    for dof, crit in CHI2_TABLE_001.items():
        tol = 0.025 if dof < 7 else 0.01  # WH is slightly conservative (too high) at small dof
        assert abs(chi2_critical(dof) - crit) / crit < tol, (dof, chi2_critical(dof), crit)


@settings(max_examples=60, deadline=None)
@given(
    z=st.lists(st.floats(-6, 6, allow_nan=False), min_size=2, max_size=12),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
    top_k=st.integers(0, 12),
    top_p=st.sampled_from([1.0, 0.95, 0.7, 0.3, 0.05]),
)
def test_sampling_logprobs_match_naive_reference(z, temperature, top_k, top_p):
    logits = torch.tensor([z], dtype=torch.float32)
    got = sampling_logprobs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))[0]
    ref = ref_logprobs(torch.tensor(z, dtype=torch.float32), temperature, top_k, top_p)
    on = torch.isfinite(ref)
    # the support can only differ on a float32 rounding tie at the top-p boundary: never seen here
    assert torch.equal(torch.isfinite(got), on)
    assert torch.allclose(got[on].double(), ref[on], atol=1e-5)
    assert abs(float(got[on].exp().sum()) - 1.0) < 1e-5


def _draw(params: SamplingParams, n: int, seed0: int = 0) -> torch.Tensor:
    u = request_uniforms(range(seed0, seed0 + n), 1)[:, 0]
    tok, lp = sample_step(LOGITS.expand(n, -1), params, u)
    logp = sampling_logprobs(LOGITS.view(1, -1), params)[0]
    assert torch.allclose(lp, logp[tok])  # behavior_logp is log mu of the drawn token
    return torch.bincount(tok, minlength=LOGITS.numel())


def _chi2_passes(counts: torch.Tensor, logp: torch.Tensor) -> tuple[bool, float, int, float]:
    on = torch.isfinite(logp)
    assert int(counts[~on].sum()) == 0, "sampled a token outside the truncated support"
    stat, dof = chi2_stat(counts[on], logp[on].exp())
    crit = CHI2_TABLE_001[dof]
    return stat < crit, stat, dof, crit


def test_sampler_matches_softmax_chi_square():
    """n = 4000 draws on V = 8 (dof 7, critical 24.322 at alpha 0.001), temperature 0.7."""
    params = SamplingParams(temperature=0.7)
    counts = _draw(params, 4000)
    ok, stat, dof, crit = _chi2_passes(counts, sampling_logprobs(LOGITS.view(1, -1), params)[0])
    print(f"chi2 = {stat:.2f}, dof = {dof}, critical(0.001) = {crit}")
    assert dof == 7 and ok


def test_sampler_matches_truncated_softmax_chi_square():
    """top-k 5 keeps 5 tokens (dof 4, critical 18.467); top-p 0.6 keeps p = .30 .20 .15 (dof 2, 13.816)."""
    for params, dof_expected in [(SamplingParams(top_k=5), 4), (SamplingParams(top_p=0.6), 2)]:
        counts = _draw(params, 3000, seed0=10_000)
        ok, stat, dof, crit = _chi2_passes(counts, sampling_logprobs(LOGITS.view(1, -1), params)[0])
        print(f"{params}: chi2 = {stat:.2f}, dof = {dof}, critical(0.001) = {crit}")
        assert dof == dof_expected and ok


def test_chi_square_rejects_the_wrong_temperature():
    """Power check: draws at temperature 0.7 are rejected as samples of the temperature-1 softmax."""
    counts = _draw(SamplingParams(temperature=0.7), 4000)
    ok, stat, _, crit = _chi2_passes(counts, sampling_logprobs(LOGITS.view(1, -1), SamplingParams())[0])
    assert not ok, (stat, crit)


def test_greedy_takes_argmax_and_reports_tempered_logp():
    params = SamplingParams(greedy=True, temperature=0.5)
    tok, lp = sample_step(LOGITS.view(1, -1), params, torch.tensor([0.999]))
    assert int(tok) == 0
    assert torch.allclose(lp, torch.log_softmax(LOGITS / 0.5, -1)[0:1])


def test_request_uniforms_depend_on_own_seed_only():
    a = request_uniforms([5, 6, 7], 4)
    b = request_uniforms([7], 4)
    assert torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1])
    assert bool((a > 0).all() and (a <= 1).all())
