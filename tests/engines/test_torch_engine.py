"""TorchEngine against a trainer-style teacher-forced forward of the same model."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import (
    EOS,
    PAD,
    VOCAB,
    chi2_critical,
    chi2_stat,
    make_requests,
    sampled_ref_logp,
    teacher_forced,
    tiny_model,
)

from satrl.engines import EngineSpec, TorchEngine, make_engine
from satrl.models.routing import capture_routing
from satrl.types import Engine, GenerationRequest, SamplingParams

SAMPLINGS = [
    SamplingParams(temperature=1.0, max_new_tokens=12),
    SamplingParams(temperature=0.7, top_k=5, max_new_tokens=12),
    SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=12),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.9, max_new_tokens=12),
]


def _engine(model, numerics="fp32", max_batch_size=256, **spec) -> TorchEngine:
    return TorchEngine(model, EngineSpec(EOS, PAD, numerics=numerics, **spec), max_batch_size=max_batch_size)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["full", "topk", "topp", "topk+topp"])
def test_fp32_behavior_logp_equals_teacher_forced(kind, sampling, request):
    model = request.getfixturevalue(kind)
    comps = _engine(model).generate(make_requests(7), sampling)
    got = torch.cat([c.behavior_logp for c in comps]).double()
    ref = sampled_ref_logp(model, comps, sampling.temperature, sampling.top_k, sampling.top_p)
    assert torch.isfinite(ref).all(), "the engine sampled a token outside the reference support"
    assert (got - ref).abs().max() < 1e-5
    assert sum(len(c.response_ids) for c in comps) > 30  # the comparison covered real decoding steps


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("numerics", ["bf16", "bf16-weights"])
def test_low_precision_mismatch_is_nonzero_and_small(kind, numerics, request, record_property):
    model = request.getfixturevalue(kind)
    sampling = SamplingParams(max_new_tokens=12)
    comps = _engine(model, numerics).generate(make_requests(16), sampling)
    d = (torch.cat([c.behavior_logp for c in comps]).double() - sampled_ref_logp(model, comps, 1.0)).abs()
    print(f"{kind} {numerics}: mean |d| = {d.mean():.2e}, p90 = {d.quantile(0.9):.2e}, max = {d.max():.2e}")
    record_property(f"mean_abs_d_{kind}_{numerics}", float(d.mean()))
    assert 1e-5 < float(d.mean()) < 0.1


def test_fp32_routing_equals_own_topk_of_teacher_forced_pass(moe):
    comps = _engine(moe).generate(make_requests(7), SamplingParams(max_new_tokens=12))
    for c in comps:
        p, t = len(c.prompt_ids), len(c.response_ids)
        assert c.routing is not None and c.routing.dtype == torch.int64 and c.routing.shape == (t, 2, 2)
        with torch.no_grad(), capture_routing(moe) as rec:
            moe(torch.tensor([c.prompt_ids + c.response_ids]))
        own = rec.take()[0, p - 1 : p - 1 + t]  # the positions whose logits sampled each response token
        assert torch.equal(own, c.routing)


def test_bf16_routing_disagreement_is_measured_nonzero(moe, record_property):
    comps = _engine(moe, "bf16").generate(
        make_requests(64, min_len=6, max_len=6), SamplingParams(max_new_tokens=16)
    )
    ids = torch.tensor([c.prompt_ids + c.response_ids for c in comps if len(c.response_ids) == 16])
    with torch.no_grad(), capture_routing(moe) as rec:
        moe(ids)
    own = rec.take()[:, 5:21].sort(-1).values
    eng = torch.stack([c.routing for c in comps if len(c.response_ids) == 16]).sort(-1).values
    rate = (own != eng).any(-1).double().mean()
    print(f"bf16 routing disagreement: {rate:.4f} of {own.shape[0] * 16 * 2} token-layers")
    record_property("bf16_route_disagree", float(rate))
    assert 0 < rate < 0.1


def test_dense_completions_have_no_routing(dense):
    (c,) = _engine(dense).generate(make_requests(1), SamplingParams(max_new_tokens=4))
    assert c.routing is None


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_same_request_same_tokens_in_any_batch(kind, request):
    model = request.getfixturevalue(kind)
    reqs = make_requests(7)
    sampling = SamplingParams(max_new_tokens=12)
    together = _engine(model).generate(reqs, sampling)
    chunked = _engine(model, max_batch_size=3).generate(reqs, sampling)
    alone = [_engine(model).generate([r], sampling)[0] for r in reqs]
    for a, b, c, r in zip(together, chunked, alone, reqs):
        assert a.request_id == r.request_id and a.prompt_ids == r.prompt_ids
        assert a.response_ids == b.response_ids == c.response_ids
        assert torch.allclose(a.behavior_logp, c.behavior_logp, atol=1e-5)
    other_seed = _engine(model).generate([GenerationRequest("x", reqs[0].prompt_ids, seed=999)], sampling)
    assert other_seed[0].response_ids != together[0].response_ids


def test_stops_at_eos_and_at_max_tokens(dense):
    class Tok:  # minimal tokenizer: the engine must decode without the EOS it stopped on
        def decode(self, ids, skip_special_tokens=True):
            assert skip_special_tokens and EOS not in ids
            return "".join(chr(97 + i % 26) for i in ids)

    sampling = SamplingParams(max_new_tokens=10)
    comps = TorchEngine(dense, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, tokenizer=Tok(), numerics="fp32")).generate(
        make_requests(40), sampling
    )
    reasons = {c.finish_reason for c in comps}
    assert reasons == {"stop", "length"}, reasons  # the tiny model emits EOS sometimes, not always
    for c in comps:
        body = c.response_ids[:-1] if c.finish_reason == "stop" else c.response_ids
        assert EOS not in body
        assert c.behavior_logp.shape == (len(c.response_ids),) and c.behavior_logp.dtype == torch.float32
        if c.finish_reason == "stop":
            assert c.response_ids[-1] == EOS and len(c.text) == len(c.response_ids) - 1
        else:
            assert len(c.response_ids) == 10 and len(c.text) == 10


def test_greedy_follows_teacher_forced_argmax(dense):
    sampling = SamplingParams(greedy=True, temperature=0.8, max_new_tokens=8)
    reqs = make_requests(5)
    comps = _engine(dense).generate(reqs, sampling)
    again = _engine(dense).generate(
        [GenerationRequest(r.request_id, r.prompt_ids, seed=r.seed + 1) for r in reqs], sampling
    )
    logits = teacher_forced(dense, comps)
    for b, (c, c2) in enumerate(zip(comps, again)):
        assert c.response_ids == c2.response_ids
        assert c.response_ids == logits[b, : len(c.response_ids)].argmax(-1).tolist()


def test_engine_first_token_chi_square(dense):
    """3000 one-token generations from one prompt (seeds 0..2999) against the model's softmax at T = 0.8;
    bins with expected count < 5 merged; critical value from Wilson-Hilferty at alpha = 0.001."""
    prompt = [5, 9, 3]
    sampling = SamplingParams(temperature=0.8, max_new_tokens=1)
    comps = _engine(dense, max_batch_size=3000).generate(
        [GenerationRequest(str(i), prompt, seed=i) for i in range(3000)], sampling
    )
    counts = torch.bincount(torch.tensor([c.response_ids[0] for c in comps]), minlength=VOCAB)
    with torch.no_grad():
        probs = torch.softmax(dense(torch.tensor([prompt])).logits[0, -1].double() / 0.8, -1)
    stat, dof = chi2_stat(counts, probs)
    print(f"engine chi2 = {stat:.2f}, dof = {dof}, critical = {chi2_critical(dof):.2f}")
    assert dof >= 10 and stat < chi2_critical(dof)
    wrong, _ = chi2_stat(counts, torch.softmax(torch.log(probs) * 0.8, -1))  # the T = 1 distribution
    assert wrong > chi2_critical(dof)


@pytest.mark.parametrize("numerics", ["fp32", "bf16-weights"])
def test_load_weights_sets_version_and_changes_outputs(dense, numerics):
    other = tiny_model("dense", seed=1)
    reqs, sampling = make_requests(4), SamplingParams(max_new_tokens=6)
    engine = _engine(dense, numerics)
    before = engine.generate(reqs, sampling)
    engine.load_weights(other.state_dict(), version=3)
    after = engine.generate(reqs, sampling)
    fresh = _engine(other, numerics, version=3).generate(reqs, sampling)
    assert engine.version == 3 and {c.version for c in before} == {0} and {c.version for c in after} == {3}
    assert [c.response_ids for c in after] == [c.response_ids for c in fresh]
    assert all(torch.equal(a.behavior_logp, f.behavior_logp) for a, f in zip(after, fresh))
    assert [c.behavior_logp.tolist() for c in before] != [c.behavior_logp.tolist() for c in after]
    w = engine.model.get_input_embeddings().weight
    src = other.get_input_embeddings().weight
    expect = src.to(torch.bfloat16).float() if numerics == "bf16-weights" else src
    assert torch.equal(w, expect)


def test_engine_holds_its_own_copy(dense):
    model = tiny_model("dense", seed=2)
    engine, reqs, sampling = _engine(model), make_requests(3), SamplingParams(max_new_tokens=6)
    before = engine.generate(reqs, sampling)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0)  # a trainer update that is never broadcast
    after = engine.generate(reqs, sampling)
    assert all(torch.equal(a.behavior_logp, b.behavior_logp) for a, b in zip(before, after))


def test_bad_inputs_raise_clear_errors(dense, moe):
    engine = _engine(dense)
    sampling = SamplingParams(max_new_tokens=8)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenerationRequest("a", [], seed=0)], sampling)
    with pytest.raises(ValueError, match="max_position_embeddings=48"):
        engine.generate([GenerationRequest("a", [3] * 41, seed=0)], sampling)
    engine.generate([GenerationRequest("a", [3] * 40, seed=0)], sampling)  # 40 + 8 = 48 fits exactly
    with pytest.raises(ValueError, match="outside"):
        engine.generate([GenerationRequest("a", [3, VOCAB], seed=0)], sampling)
    with pytest.raises(ValueError, match="valid choices.*bf16-weights"):
        _engine(dense, "fp16")
    with pytest.raises(ValueError, match="MoE"):
        _engine(dense, capture_routing=True)
    with pytest.raises(KeyError, match="missing keys"):
        engine.load_weights({k: v for k, v in dense.state_dict().items() if "norm" not in k}, version=1)
    with pytest.raises(KeyError, match="unknown keys"):
        engine.load_weights(moe.state_dict(), version=1)
    assert engine.version == 0


def test_registry(dense):
    engine = make_engine("torch", model=dense, eos_token_id=EOS, pad_token_id=PAD)
    assert (
        isinstance(engine, Engine) and isinstance(engine, TorchEngine) and engine.numerics == "bf16-weights"
    )
    with pytest.raises(ValueError, match=r"unknown engine 'vlm'; valid choices: \['torch', 'vllm'\]"):
        make_engine("vlm", model=dense)


def test_completion_tensors_are_ordinary_tensors(moe):
    """Decoding runs under inference_mode; what it returns must still work in autograd and in place."""
    (c,) = _engine(moe).generate(make_requests(1), SamplingParams(max_new_tokens=4))
    assert not c.behavior_logp.is_inference() and not c.routing.is_inference()
    logp = torch.zeros_like(c.behavior_logp, requires_grad=True)
    (torch.exp(logp - c.behavior_logp) * c.behavior_logp).sum().backward()
    assert logp.grad is not None
    c.behavior_logp.add_(0.0)


def test_engine_for_falls_back_to_eos_when_the_tokenizer_has_no_pad_token():
    """One engine construction for the whole codebase; a tokenizer without a pad token (Llama-style) pads
    with EOS instead of reaching int(None) deep in the engine."""
    from types import SimpleNamespace

    from satrl.engines.registry import engine_for, pad_id
    from satrl.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=1)
    no_pad = SimpleNamespace(pad_token_id=None, eos_token_id=tok.eos_token_id)
    assert pad_id(no_pad) == tok.eos_token_id and pad_id(tok) == tok.pad_token_id
    engine = engine_for("torch", no_pad, model=model)
    assert engine.pad_token_id == tok.eos_token_id
    with pytest.raises(ValueError, match="neither a pad nor an EOS token"):
        pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=None))
