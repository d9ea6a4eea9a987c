"""Tiny Qwen3 / Qwen3-MoE policies, the character tokenizer, and loading of local HF causal LMs.

- :func:`build_char_tokenizer`: character tokenizer (BOS prepended to prompts, EOS ends answers).
- :func:`build_tiny_model`: a fresh ~1.05M-parameter dense or MoE causal LM, deterministic per seed.
- :func:`load_policy`: ``(model, tokenizer)`` from a built-in name (``tiny-arith``, ``tiny-arith-moe``)
  or a local HF directory (safetensors only); :func:`empty_model` and :func:`meta_copy`, the same architecture on the meta device.
- ``satrl.training.pretrain``: ``satrl pretrain``, which trains the built-ins (imported on demand).
- ``satrl.models.routing``: MoE routing capture and replay (R3).

Names are imported when first asked for (as in :mod:`satrl.engines`), so that the ``model:`` config section
(:mod:`satrl.models.config`) imports neither torch nor transformers.
"""

from types import ModuleType

from satrl.lazy import names_from


def _module(name: str) -> ModuleType:
    """The models module ``name``, imported when one of its names is first asked for (import statements, so the
    import graph sees each)."""
    match name:
        case "tiny":
            from satrl.models import tiny as module
        case "tokenizer":
            from satrl.models import tokenizer as module
        case "builtins":
            from satrl.models import builtins as module
        case _:
            from satrl.models import loading as module
    return module


_WHERE = {"BUILTINS": "builtins", "PolicyLoadError": "loading", "builtin_path": "loading", "empty_model": "loading",
          "load_model": "loading", "load_policy": "loading", "load_tokenizer": "loading", "meta_copy": "loading",
          "quiet_progress_bars": "loading", "build_tiny_model": "tiny", "count_params": "tiny",
          "build_char_tokenizer": "tokenizer"}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
