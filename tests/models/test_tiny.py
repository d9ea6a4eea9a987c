"""Tiny model builders: hand-counted sizes, determinism per seed, kinds registry."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

from satrl.models import build_tiny_model, count_params

V, H, LAYERS, FF, E, FF_MOE = 52, 128, 4, 512, 8, 64


def _expected(kind: str) -> int:
    attn = 4 * H * H + 2 * 32  # q, k, v, o (4 KV heads of 32) + q_norm, k_norm
    mlp = 3 * H * FF if kind == "dense" else E * 3 * H * FF_MOE + E * H  # experts + router
    per_layer = attn + mlp + 2 * H  # two RMSNorms
    return V * H + LAYERS * per_layer + H  # tied embeddings + final norm


@pytest.mark.parametrize("kind,cls", [("dense", Qwen3ForCausalLM), ("moe", Qwen3MoeForCausalLM)])
def test_size_and_class(kind, cls):
    model = build_tiny_model(kind, vocab_size=V, seed=0)
    assert isinstance(model, cls)
    assert count_params(model) == _expected(kind)
    assert 1.0e6 < count_params(model) < 1.1e6
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_deterministic_for_seed(kind):
    state = torch.get_rng_state()
    a = build_tiny_model(kind, vocab_size=V, seed=3).state_dict()
    b = build_tiny_model(kind, vocab_size=V, seed=3).state_dict()
    c = build_tiny_model(kind, vocab_size=V, seed=4).state_dict()
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"]
    )


def test_moe_config_and_overrides():
    model = build_tiny_model("moe", vocab_size=V, num_hidden_layers=2)
    cfg = model.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 64)
    assert cfg.num_hidden_layers == 2
    logits = model(input_ids=torch.randint(0, V, (3, 7))).logits
    assert logits.shape == (3, 7, V)


def test_unknown_kind_names_choices():
    with pytest.raises(ValueError, match=r"unknown model kind .sparse.; valid choices: \['dense', 'moe'\]"):
        build_tiny_model("sparse", vocab_size=V)
