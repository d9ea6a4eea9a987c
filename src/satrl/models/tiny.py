"""Tiny Qwen3 (dense) and Qwen3-MoE policies built from ``transformers`` configs.

Both kinds have about 1.05M parameters (hidden 128, 4 layers, 4 heads of 32, 4 KV heads, tied
embeddings). The dense MLP has intermediate size 512; the MoE replaces it with 8 experts of intermediate
size 64, top-2, so the *total* parameter count matches the dense model (8 x 64 = 512) and a forward pass
uses a quarter of the MLP weights. No auxiliary load-balancing loss: routing collapse is not a concern at
this scale and the loss stays a plain next-token loss. Models are fp32 with SDPA attention (CPU-friendly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from satrl.registry import Registry

COMMON: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=64,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    use_cache=True,
)
DENSE: dict[str, Any] = dict(intermediate_size=512)
MOE: dict[str, Any] = dict(
    intermediate_size=512,  # unused: every layer is sparse (decoder_sparse_step=1)
    moe_intermediate_size=64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    output_router_logits=False,
    router_aux_loss_coef=0.0,
)


KINDS: Registry[Callable[[dict[str, Any]], tuple[PretrainedConfig, type[PreTrainedModel]]]] = Registry("model kind")


@KINDS.register("dense")
def _dense(cfg: dict[str, Any]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    return Qwen3Config(**{**COMMON, **DENSE, **cfg}), Qwen3ForCausalLM


@KINDS.register("moe")
def _moe(cfg: dict[str, Any]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    return Qwen3MoeConfig(**{**COMMON, **MOE, **cfg}), Qwen3MoeForCausalLM


def build_tiny_model(kind: str = "dense", vocab_size: int = 52, seed: int = 0, **cfg: Any) -> PreTrainedModel:
    """A freshly initialised tiny Qwen3 (``kind="dense"``) or Qwen3-MoE (``kind="moe"``) causal LM, fp32,
    in eval mode. The same ``(kind, vocab_size, seed, cfg)`` always gives bit-identical weights; the
    global torch RNG is left as it was."""
    config, cls = KINDS.get(kind)({"vocab_size": vocab_size, **cfg})
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.to(torch.float32).eval()


def count_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
