"""Tiny Qwen3 / Qwen3-MoE policies, the character tokenizer, and loading of local HF causal LMs.

- :func:`build_char_tokenizer`: character tokenizer (BOS prepended to prompts, EOS ends answers).
- :func:`build_tiny_model`: a fresh ~1.05M-parameter dense or MoE causal LM, deterministic per seed.
- :func:`load_policy`: ``(model, tokenizer)`` from a built-in name (``tiny-arith``, ``tiny-arith-moe``)
  or a local HF directory (safetensors only); :func:`empty_model` and :func:`meta_copy`, the same architecture on the meta device.
- ``satrl.training.pretrain``: ``satrl pretrain``, which trains the built-ins (imported on demand).
- ``satrl.models.routing``: MoE routing capture and replay (R3).
"""

from __future__ import annotations

from satrl.models.loading import (
    BUILTINS,
    PolicyLoadError,
    builtin_path,
    empty_model,
    load_model,
    load_policy,
    load_tokenizer,
    meta_copy,
    quiet_progress_bars,
)
from satrl.models.tiny import build_tiny_model, count_params
from satrl.models.tokenizer import build_char_tokenizer

__all__ = [
    "BUILTINS",
    "PolicyLoadError",
    "build_char_tokenizer",
    "build_tiny_model",
    "builtin_path",
    "empty_model",
    "count_params",
    "load_model",
    "load_policy",
    "load_tokenizer",
    "meta_copy",
    "quiet_progress_bars",
]
