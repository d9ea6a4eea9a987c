"""Batched per-sequence score norms (satrl.training.score_norms) against the per-row reference: one forward and
one backward per row, every parameter's gradient squared and summed (the loop the trainer ran before). Per
parameter and per row, within 1e-6 relative in float64, on the tiny dense and MoE policies and a random-weight
layer of Qwen3-0.6B's shape; a dropped cross term of the tied embedding, a dropped rule or a wrong branch of the
mixed rule fails them."""

import copy
import gc

import pytest
import torch
from test_trainer import make_batch

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.training import score_norms as sn
from satrl.training.logprobs import response_logp
from satrl.training.microbatches import row_slice
from satrl.training.score_rules import Outer

TEMP = 0.7


def reference(model, batch):
    """{parameter name: [B] float64}: ||d/dtheta sum_t log pi(y_bt)||^2 per parameter, one row at a time."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = {n: [] for n, _ in named}
    for i in range(batch.mask.shape[0]):
        row = row_slice(batch, i, i + 1)
        lp, _ = response_logp(model, row, TEMP)
        grads = torch.autograd.grad(torch.where(row.mask, lp, 0.0).sum(), [p for _, p in named], allow_unused=True)
        for (n, _), g in zip(named, grads):
            out[n].append(0.0 if g is None else float(g.double().square().sum()))
    return {n: torch.tensor(v, dtype=torch.float64) for n, v in out.items()}


def batched(model, batch):
    return sn.parameter_score_norms(model, lambda: response_logp(model, batch, TEMP)[0], batch.mask)


def qwen3_layer(vocab):
    """One decoder layer of Qwen3-0.6B's shape (hidden 1024, 16 query / 8 KV heads of 128, MLP 3072, tied
    embeddings), random weights, a smaller vocabulary so that the per-row reference stays quick."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=1024, num_hidden_layers=1, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                      max_position_embeddings=64)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).double().eval()


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def model_of(kind, tok):
    if kind == "qwen3-0.6b-layer":
        return qwen3_layer(len(tok))
    model = build_tiny_model(kind, vocab_size=len(tok), seed=0, num_hidden_layers=2).double()
    if kind == "moe":  # transformers' grouped_mm experts take no float64; the eager loop is the same arithmetic
        model.set_experts_implementation("eager")
    return model


def assert_parts_equal(got, want):
    assert set(got) == set(want)  # every trainable parameter has its share, under its own name
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-6, atol=1e-12 * float(w.abs().max()), msg=name)


@pytest.mark.parametrize("kind", ["dense", "moe", "qwen3-0.6b-layer"])
def test_each_parameters_share_equals_the_per_row_reference(kind, tok):
    model = model_of(kind, tok)
    batch = make_batch(tok, n=6)
    logp, parts = batched(model, batch)
    assert_parts_equal(parts, reference(model, batch))
    torch.testing.assert_close(logp, response_logp(model, batch, TEMP)[0].detach())
    assert all(p.grad is None for p in model.parameters())  # .grad untouched
    _, total = sn.score_norms(model, lambda: response_logp(model, batch, TEMP)[0], batch.mask)
    torch.testing.assert_close(total, sum(parts.values()), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind", ["dense", "qwen3-0.6b-layer"])
def test_the_chunked_log_prob_path_gives_the_same_shares(kind, tok):
    """With the LM head on chunks of 5 positions under checkpointing (``chunk_tokens``), its share (and the tied
    embedding's cross term) is rebuilt row by row from its inputs: equal to the per-row reference too."""
    model = model_of(kind, tok)
    batch = make_batch(tok, n=6)
    head = sn.ChunkedHead(model.get_output_embeddings(), batch.response_ids, TEMP)
    logp, parts = sn.parameter_score_norms(
        model, lambda: response_logp(model, batch, TEMP, chunk_tokens=5)[0], batch.mask, head)
    assert_parts_equal(parts, reference(model, batch))
    assert len(head.inputs) == 1  # the chunks' inputs, kept once
    torch.testing.assert_close(logp, response_logp(model, batch, TEMP)[0].detach())


def test_the_tied_weights_cross_term_counts(tok, monkeypatch):
    """Embedding and LM head share one weight: without the cross term between its two uses (a sum of per-module
    norms) the test above fails on that weight and only there."""
    model = model_of("dense", tok)
    batch = make_batch(tok)
    want = reference(model, batch)
    monkeypatch.setattr(sn, "_cross", lambda u, v: torch.zeros(u.right.shape[0] if isinstance(u, Outer) else
                                                                  u.value.shape[0], dtype=torch.float64))
    _, parts = batched(model, batch)
    wrong = [n for n in want if not torch.allclose(parts[n], want[n], rtol=1e-6)]
    assert wrong == ["model.embed_tokens.weight"]


def test_without_a_rule_a_parameter_has_no_share_and_the_test_sees_it(tok):
    model = model_of("moe", tok)
    batch = make_batch(tok)
    with sn.RULES.replaced("Qwen3MoeTopKRouter", sn.RULES.get("Qwen3MoeTopKRouter").__class__(
            params=lambda m: [m.weight], record=lambda *a: None)):  # fmt: skip
        _, parts = batched(model, batch)
    with pytest.raises(AssertionError):
        assert_parts_equal(parts, reference(model, batch))


@pytest.mark.parametrize("n_tokens", [3, 40])  # ghost (N (o + i) < o i) and materialized
def test_the_mixed_rule_takes_either_branch_exactly(n_tokens):
    g = torch.Generator().manual_seed(1)
    left, right = torch.randn(4, n_tokens, 6, generator=g, dtype=torch.float64), torch.randn(4, n_tokens, 5, generator=g,
                                                                                       dtype=torch.float64)  # fmt: skip
    want = torch.einsum("bno,bni->boi", left, right).square().sum((1, 2))
    torch.testing.assert_close(sn._outer_self(Outer(left, right, 6)), want, rtol=1e-12, atol=0)
    ids = torch.randint(0, 6, (4, n_tokens), generator=g)
    onehot = torch.nn.functional.one_hot(ids, 6).double()
    dense_want = torch.einsum("bno,bni->boi", onehot, right).square().sum((1, 2))
    torch.testing.assert_close(sn._outer_self(Outer(ids, right, 6)), dense_want, rtol=1e-12, atol=0)
    torch.testing.assert_close(sn._cross(Outer(ids, right, 6), Outer(left, right, 6)),
                               (torch.einsum("bno,bni->boi", onehot, right) * torch.einsum("bno,bni->boi", left, right)).sum((1, 2)),
                               rtol=1e-12, atol=0)  # fmt: skip


def test_a_parameter_no_rule_covers_is_refused_by_name(tok):
    model = model_of("dense", tok)
    model.model.layers[0].self_attn.register_parameter("sink", torch.nn.Parameter(torch.zeros(4)))
    batch = make_batch(tok)
    with pytest.raises(sn.ScoreNormError) as err:
        batched(model, batch)
    assert "model.layers.0.self_attn.sink (Qwen3Attention)" in str(err.value) and "\n" not in str(err.value)
    model.model.layers[0].self_attn.sink.requires_grad_(False)  # frozen: nothing to measure
    batched(model, batch)


def test_trainer_scores_equal_the_reference_with_checkpointing_and_chunked_log_probs(tok):
    from satrl.objectives import resolve_objective
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    batch = make_batch(tok)
    want = sum(reference(copy.deepcopy(model), batch).values())
    for ckpt, chunk in ((False, 0), (True, 0), (False, 16), (True, 5)):  # chunked log-probs: the head row by row
        t = Trainer(copy.deepcopy(model), resolve_objective("vcpo"), TrainerSettings(
            lr=1e-2, temperature=TEMP, activation_checkpointing=ckpt, microbatch_tokens=40,
            logprob_chunk_tokens=chunk))  # fmt: skip
        _, sq = t.advantages.sequence_scores(batch)
        torch.testing.assert_close(sq, want, rtol=1e-4, atol=0)  # fp32 trainer against the fp32 reference


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_no_tensor_outlives_the_call_in_a_reference_cycle(kind, tok):
    """Every tensor of the pass is freed when it returns, not at the next full garbage collection: the records'
    closures held their tape, a cycle that kept each microbatch's activations alive until then (issue 57: the
    real run's trainer grew ~1 GB per step and was OOM-killed at step 8)."""
    model = model_of(kind, tok)
    batch = make_batch(tok, n=6)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable stays in gc.garbage, to be seen
    try:
        batched(model, batch)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []
