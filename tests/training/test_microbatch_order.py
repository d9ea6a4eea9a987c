"""Microbatches shaped to their rows: the LM head on each microbatch's own longest response (bit for bit the numbers
of the batch-wide width), ``train.microbatch_order=by_length`` (its plan, its step, its log-probs back in batch
order), ``logprob_chunk_tokens=auto``, the keys in config.yaml, and the token-efficiency numbers of the benchmark's
fixed mixes."""

import pytest
import torch
import yaml
from benchmarks.token_efficiency import efficiency, lengths_batch, mix, ordered
from test_trainer import make_trainer

from run_helpers import rounding_atol
from satrl.config import build_config, load_config
from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.pipeline.buffer import collate
from satrl.training import trainer as trainer_mod
from satrl.training.logprobs import chunk_for_vocab, full_logits_bytes, response_logp, vocab_size
from satrl.training.microbatches import Micro, length_order, plan_microbatches, row_slice, split_rows
from satrl.types import Sample

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.3, -0.3, 0.0])


RESPONSES = [2, 9, 1, 3, 8, 2, 1, 7, 3]  # responses of very different lengths, in no order


def make_batch(tok, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt = tok(f"{i}{i}+{i}=")["input_ids"]
        resp = torch.randint(3, len(tok), (RESPONSES[(i + seed) % 9],), generator=g).tolist()
        samples.append(Sample(f"s{i}", f"g{i // 3}", prompt, resp, -torch.rand(len(resp), generator=g), 0, float(i % 2)))
    return collate(samples, tok.pad_token_id)


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def test_plan_width_is_each_microbatchs_longest_response(tiny):
    _, tok = tiny
    batch = make_batch(tok, n=9, seed=1)
    responses = (batch.attention_mask.sum(1) - batch.prompt_len).tolist()
    plan = plan_microbatches(batch, 30)
    assert len(plan) > 1 and all(isinstance(p, Micro) for p in plan)
    assert [p.width for p in plan] == [max(responses[p.start : p.end]) for p in plan]
    assert any(p.width < batch.mask.shape[1] for p in plan)  # some microbatch is narrower than the batch


@pytest.mark.parametrize("chunk", [0, 5])
def test_trimmed_head_equals_the_batch_width(tiny, chunk):
    model, tok = tiny
    batch = make_batch(tok, n=9, seed=2)
    for p in plan_microbatches(batch, 30):
        m = row_slice(batch, p.start, p.end)
        kw = dict(length=p.longest, padded=p.padded, chunk_tokens=chunk)
        wide, _ = response_logp(model, m, 0.7, **kw)
        narrow, _ = response_logp(model, m, 0.7, width=p.width, **kw)
        assert narrow.shape == wide.shape
        if chunk == 0:  # the full path (the default): every row's tokens, the same bits
            assert torch.equal(narrow[:, : p.width], wide[:, : p.width])
        else:  # chunks of other rows: the head's matmuls group rows differently, to fp32 rounding
            torch.testing.assert_close(narrow[:, : p.width], wide[:, : p.width], atol=1e-6, rtol=1e-6)
        assert not narrow[:, p.width :].any()  # past every row's end: zeros


def _untrimmed_plan(mb, budget):
    return [p._replace(width=mb.mask.shape[1]) for p in ORIGINAL_PLAN(mb, budget)]


ORIGINAL_PLAN = plan_microbatches


def test_shuffled_step_with_trimmed_head_equals_the_untrimmed_step(tiny, monkeypatch):
    """The default path (shuffled, full logits) gives the numbers of the batch-wide head: every metric and every
    weight bit for bit (what tests/e2e/test_replay.py checks on whole runs)."""
    model, tok = tiny
    runs = []
    for trim in (True, False):
        if not trim:
            monkeypatch.setattr(trainer_mod, "plan_microbatches", _untrimmed_plan)
        t = make_trainer(model, "sat_grpo", microbatch_tokens=30)
        metrics = [t.step(make_batch(tok, n=9, seed=s), ADV) for s in range(2)]
        runs.append((metrics, t.model.state_dict()))
    (m1, w1), (m0, w0) = runs
    assert m1 == m0
    assert all(torch.equal(w1[k], w0[k]) for k in w0)


def test_length_order_is_a_stable_longest_first_permutation(tiny):
    _, tok = tiny
    batch = make_batch(tok, n=9, seed=3)
    order = length_order(batch)
    assert sorted(order.tolist()) == list(range(9))
    lengths = batch.attention_mask.sum(1)
    key = (2 * lengths - batch.prompt_len)[order].tolist()
    assert key == sorted(key, reverse=True)
    for a, b in zip(order.tolist(), order.tolist()[1:]):  # ties keep batch order
        if key[order.tolist().index(a)] == key[order.tolist().index(b)]:
            assert a < b


def test_by_length_step_equals_shuffled_on_one_microbatch(tiny):
    """With the whole minibatch in one microbatch the order only reorders sums: the same step to fp32 rounding."""
    model, tok = tiny
    out = {}
    for order in ("shuffled", "by_length"):
        t = make_trainer(model, "sat_grpo", whole_batch_quantile=True, microbatch_order=order)
        out[order] = (t.step(make_batch(tok, n=9, seed=4), ADV), t.model.state_dict())
    (ms, ws), (mb, wb) = out["shuffled"], out["by_length"]
    assert ms.keys() == mb.keys()
    for k in ms:
        assert mb[k] == pytest.approx(ms[k], rel=1e-5, abs=rounding_atol(ms, k)), k
    for k in ws:  # AdamW's first step is ~lr x sign(grad): a rounding-level gradient can move a weight by 1e-6
        torch.testing.assert_close(wb[k], ws[k], atol=1e-5, rtol=1e-4)


def test_by_length_cuts_sorted_rows_and_pads_less(tiny):
    model, tok = tiny
    batch = make_batch(tok, n=9, seed=5)
    t = make_trainer(model, "sat_grpo", microbatch_tokens=30, microbatch_order="by_length")
    metrics = t.step(batch, ADV)
    assert metrics["skipped"] == 0.0 and len(t.microbatch_metrics) == len(plan_microbatches(split_rows(batch, length_order(batch)), 30))
    sorted_plan = plan_microbatches(split_rows(batch, length_order(batch)), 30)
    pad = lambda plan: sum((p.end - p.start) * p.longest for p in plan)  # noqa: E731
    assert pad(sorted_plan) <= pad(plan_microbatches(batch, 30))


def test_by_length_log_probs_come_back_in_batch_order(tiny):
    model, tok = tiny
    batch = make_batch(tok, n=9, seed=6)
    plain = make_trainer(model, "sat_grpo", microbatch_tokens=30)
    by_len = make_trainer(model, "sat_grpo", microbatch_tokens=30, microbatch_order="by_length")
    a, b = plain.logp_with(None, batch), by_len.logp_with(None, batch)
    torch.testing.assert_close(b[batch.mask], a[batch.mask], atol=1e-6, rtol=1e-6)
    snap = {k: v.clone() for k, v in model.state_dict().items()}
    torch.testing.assert_close(by_len.logp_with(snap, batch)[batch.mask], a[batch.mask], atol=1e-6, rtol=1e-6)


def test_unknown_order_is_refused(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="microbatch_order"):
        make_trainer(model, microbatch_order="random")


def test_auto_chunk_comes_from_the_vocabulary(tiny):
    model, _ = tiny
    assert chunk_for_vocab(151936) == 2048 and chunk_for_vocab(32000) == 16384 and chunk_for_vocab(10**9) == 16
    t = make_trainer(model, logprob_chunk_tokens="auto")
    assert t.scorer.chunk_tokens == chunk_for_vocab(vocab_size(model))
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        make_trainer(model, logprob_chunk_tokens="big")
    # the full path's vocabulary tensors of a 16k-token microbatch of Qwen3: well past what chunks of 2048 hold
    assert full_logits_bytes(4, 4096, 4000, 151936, torch.bfloat16) / 2**30 > 30


def test_new_train_keys_are_saved_and_load_back(tmp_path):
    cfg = load_config(None, ["train.microbatch_order=by_length", "train.compile=true", "train.logprob_chunk_tokens=auto"])
    saved = cfg.model_dump(mode="json")
    assert (saved["train"]["microbatch_order"], saved["train"]["compile"], saved["train"]["logprob_chunk_tokens"]) == (
        "by_length", True, "auto")  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    assert load_config(tmp_path / "config.yaml") == cfg == build_config(saved)
    old = load_config(None, []).model_dump(mode="json")  # a run directory from before these keys
    del old["train"]["microbatch_order"], old["train"]["compile"]
    assert build_config(old) == load_config(None, [])
    assert load_config(None, ["train.logprob_chunk_tokens=64"]).train.logprob_chunk_tokens == 64


@pytest.mark.parametrize("name, decoder, head", [("rl", 1.06, 1.07), ("uniform", 1.03, 1.03)])
def test_token_efficiency_of_the_fixed_mixes(name, decoder, head):
    """benchmarks/token_efficiency.py's plans: by_length within 1.10x of the real tokens for the decoder and the
    head; shuffled still trims the head to each microbatch's width (below the batch-wide width)."""
    batch = lengths_batch(*mix(name))
    by_len, shuffled = efficiency(ordered(batch, "by_length"), 16384), efficiency(ordered(batch, "shuffled"), 16384)
    assert by_len["decoder"] == pytest.approx(decoder, abs=0.005) and by_len["head"] == pytest.approx(head, abs=0.005)
    assert by_len["decoder"] <= 1.10 and by_len["head"] <= 1.10
    assert shuffled["head"] < shuffled["head_batch_width"] and shuffled["decoder"] > 1.3


def test_traced_peak_of_one_microbatch_runs_the_trainer():
    """benchmarks/token_efficiency.py's trace: the real Trainer (a fake-tensor placement) on a 1-layer Qwen3 shape
    runs one microbatch's forward and backward; every part of the peak is counted and the peak holds the largest."""
    from benchmarks.token_efficiency import recipe, trace_peak

    cfg = recipe()
    out = trace_peak(cfg, ordered(lengths_batch(*mix("rl")), cfg.train.microbatch_order), layers=1, vocab=1024)
    parts = [out[k] for k in ("param_gib", "grad_gib", "act_gib", "opt_gib")]
    assert all(p > 0 for p in parts) and out["peak_gib"] >= max(parts)
    assert out["rows"] >= 1 and out["longest"] >= out["width"] >= 1
