"""benchmarks/memory.py: its logic on tiny shapes (--quick), and what its measurements must show."""

from benchmarks import memory
from benchmarks._report import DOC


def test_quick_run_reports_and_writes_nothing(capsys):
    before = DOC.read_text() if DOC.exists() else None
    assert memory.main(["--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "| tiny |" in out and "Target tiny at 16,384 tokens" in out
    assert (DOC.read_text() if DOC.exists() else None) == before


def test_checkpointing_saves_only_each_layer_input_and_chunking_drops_the_vocab_path():
    shapes = memory.QUICK_SHAPES
    res = memory.measure_all(shapes, "tiny", 1000, [32, 64])
    hidden = shapes["tiny"]["hidden_size"]
    assert res["after"]["layer"]["tiny"] == 4 * hidden  # the fp32 residual stream entering each layer
    assert res["before"]["layer"]["tiny"] > 10 * 4 * hidden  # every intermediate of the layer
    assert res["before"]["head"] >= 4 * 1000  # an fp32 [tokens, vocab] log-softmax output is saved
    assert res["after"]["head"] < 4 * 1000
    for setting, check in ((s, res[s]["check"]) for s in memory.SETTINGS):
        assert 0 <= check["measured"] - check["formula"] < 1024, setting  # AdamW's step counters only


def test_random_policies_tie_the_lm_head_as_their_shape_says():
    """Built on the meta device and then allocated, a module gets its own tensor per parameter: a tied shape
    (Qwen3-0.6B, 1.7B) must come back tied, or every benchmark on it counts the embedding twice."""
    for tied in (True, False):
        shape = {**memory.QUICK_SHAPES["tiny"], "tie_word_embeddings": tied}
        model = memory.random_qwen3(shape, 2, 1000)
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
        assert sum(p.numel() for p in model.parameters()) == memory.param_count(shape, 2, vocab=1000)


def test_fsdp_buffers_count_two_layers_and_the_root_by_hand():
    """The tiny shape by hand: a Qwen3 layer is q 64x64, k and v 64x32, o 64x64, q/k norms 16 each, two norms of
    64, gate/up/down 64x128 each = 37,024 parameters; the root is the tied 1000x64 embedding and the final norm
    = 64,064. Gathered in bf16: 2 layers + root; unsharded gradients in bf16 plus their fp32 copy: 6 bytes."""
    buf = memory.fsdp_buffers(memory.QUICK_SHAPES["tiny"], 1000, "after")
    assert buf["gather"] == 2 * 37_024 * 2 + 64_064 * 2
    assert buf["reduce"] == 2 * 37_024 * 6 + 64_064 * 6
    fp32 = memory.fsdp_buffers(memory.QUICK_SHAPES["tiny"], 1000, "before")
    assert fp32["gather"] == 2 * 37_024 * 4 + 64_064 * 4 and fp32["reduce"] == fp32["gather"]
