"""Local Hugging Face models that are not the built-ins: other architectures, a BPE tokenizer with Qwen-style
special tokens, and a Qwen3-MoE shaped like Qwen3-30B-A3B (many experts, top-k renormalized), all built and
saved by the test at random weights. They go through the same paths a user's downloaded checkpoint does:
``load_policy``, the torch engine, R3's replay hook, and ``satrl train model.path=...``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from run_helpers import REPO, TINY, collated_routing, read_jsonl
from satrl.engines import EngineSpec, TorchEngine
from satrl.models import load_policy
from satrl.models.routing import capture_routing, moe_num_layers, moe_top_k, replay_routing
from satrl.tasks import make_task
from satrl.types import GenerationRequest, SamplingParams

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=128, initializer_range=0.1)  # fmt: skip


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on arithmetic text: multi-character tokens, and Qwen's special
    tokens (pad ``<|endoftext|>``, eos ``<|im_end|>``) at ids a char tokenizer would never use."""
    task = make_task("arithmetic")
    text = [p.prompt + p.answer for p, _ in zip(task.problems("train", seed=0), range(2000))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def qwen3_moe(vocab: int) -> Qwen3MoeForCausalLM:
    """Qwen3-30B-A3B's MoE shape, scaled down: every layer sparse, many small experts, top-k renormalized."""
    cfg = Qwen3MoeConfig(vocab_size=vocab, moe_intermediate_size=16, num_experts=16, num_experts_per_tok=4,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], **SMALL)  # fmt: skip
    return Qwen3MoeForCausalLM(cfg)


ARCHS = {
    "llama": lambda v: LlamaForCausalLM(LlamaConfig(vocab_size=v, intermediate_size=128, **SMALL)),
    "qwen3_moe": qwen3_moe,
    "mixtral": lambda v: MixtralForCausalLM(
        MixtralConfig(vocab_size=v, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, **SMALL)
    ),
}


def save_hf(path, arch: str, seed: int = 0):
    tok = bpe_tokenizer()
    torch.manual_seed(seed)
    model = ARCHS[arch](len(tok)).float().eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-moe")
    save_hf(path, "qwen3_moe")
    return path


def test_bpe_tokenizer_is_not_char_level():
    tok = bpe_tokenizer()
    ids = tok("123+456=")["input_ids"]
    assert len(ids) < len("123+456=")  # merges learned
    assert tok.decode(ids) == "123+456="
    assert tok.eos_token_id != tok.pad_token_id and tok.eos_token_id >= 0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_any_local_causal_lm_loads_and_generates(tmp_path, arch):
    model, tok = save_hf(tmp_path, arch)
    loaded, loaded_tok = load_policy(tmp_path)
    assert type(loaded) is type(model) and AutoConfig.from_pretrained(tmp_path).model_type == arch
    assert moe_num_layers(loaded) == (0 if arch == "llama" else 2)
    prompt = loaded_tok("12+34=")["input_ids"]
    engine = TorchEngine(loaded, EngineSpec(eos_token_id=loaded_tok.eos_token_id, pad_token_id=loaded_tok.pad_token_id, numerics="fp32"))  # fmt: skip
    (c,) = engine.generate([GenerationRequest("r0", prompt, seed=3)], SamplingParams(max_new_tokens=6))
    # behavior_logp is what the fp32 model itself assigns to the sampled tokens
    ids = torch.tensor([c.prompt_ids + c.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    P, T = len(prompt), len(c.response_ids)
    ref = logp[P - 1 : P - 1 + T].gather(-1, torch.tensor(c.response_ids).view(-1, 1)).squeeze(-1)
    assert T >= 1 and (c.behavior_logp.double() - ref).abs().max() < 1e-5


def test_r3_on_a_saved_qwen3_moe_uses_the_same_replay_hook(moe_dir):
    """A bf16 engine routes differently from the fp32 trainer; replaying the engine's routing through the
    hook makes the trainer use exactly the engine's experts, and with an fp32 engine reproduces its
    log-probs."""
    model, tok = load_policy(moe_dir)
    assert (moe_num_layers(model), moe_top_k(model)) == (2, 4)
    reqs = [GenerationRequest(f"r{i}", tok(f"{i:02d}+{2 * i:02d}=")["input_ids"], seed=i) for i in range(32)]
    sampling = SamplingParams(max_new_tokens=10)
    eos, pad = tok.eos_token_id, tok.pad_token_id

    comps = TorchEngine(model, EngineSpec(eos_token_id=None, pad_token_id=pad, numerics="bf16")).generate(reqs, sampling)
    disagree = False
    for c in comps:  # one row at a time: BPE prompts differ in length
        P, T = len(c.prompt_ids), len(c.response_ids)
        row = torch.tensor([c.prompt_ids + c.response_ids])
        with torch.no_grad(), capture_routing(model) as rec:
            model(row)
            own = rec.take()[0, P - 1 : P - 1 + T]
            with replay_routing(model, collated_routing([c])):
                model(row)
            used = rec.take()[0, P - 1 : P - 1 + T]
        disagree |= bool((own.sort(-1).values != c.routing.sort(-1).values).any())
        assert torch.equal(used, c.routing)
    assert disagree  # there was something for R3 to fix

    comps = TorchEngine(model, EngineSpec(eos_token_id=eos, pad_token_id=pad, numerics="fp32")).generate(reqs[:4], sampling)
    for c in comps:
        P, row = len(c.prompt_ids), torch.tensor([c.prompt_ids + c.response_ids])
        routing = collated_routing([c])
        with torch.no_grad(), replay_routing(model, routing):
            logp = torch.log_softmax(model(row).logits[0].double(), -1)
        ref = logp[P - 1 : P - 1 + len(c.response_ids)].gather(-1, torch.tensor(c.response_ids).view(-1, 1))
        assert (c.behavior_logp.double() - ref.squeeze(-1)).abs().max() < 1e-5


@pytest.mark.slow
def test_satrl_train_model_path_with_r3(moe_dir, tmp_path):
    """The command a user runs on a downloaded checkpoint, with R3, on the saved Qwen3-MoE."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "satrl", "train", str(REPO / "configs" / "sat_grpo_r3.yaml"), *TINY,
            f"model.path={moe_dir}", "engine.numerics=bf16", "steps=3", "lag.n=2", f"out={out}"]  # fmt: skip
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    config = (out / "config.yaml").read_text()
    assert str(moe_dir) in config and "r3: true" in config
    rows = read_jsonl(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    # without replay the fp32 trainer would disagree with the bf16 engine on some experts; R3 removes it
    assert all(row["moe/route_disagree"] == 0 for row in rows), [row["moe/route_disagree"] for row in rows]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
