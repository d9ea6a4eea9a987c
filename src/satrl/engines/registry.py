"""Engine registry: the one place where an engine name becomes an engine.

Every builder takes the same keyword arguments, so callers never branch on the name: ``model`` (an
already-loaded ``nn.Module``, optional), ``model_path`` (a built-in name or a local HF directory),
``tokenizer``, ``eos_token_id``, ``pad_token_id``, ``numerics``, ``capture_routing`` (the fields of
:class:`~satrl.engines.spec.EngineSpec`, which the builder gathers into the engine's one spec argument), plus
engine-specific extras (``engine.kwargs`` in the config). The torch engine runs a copy of ``model`` (loading ``model_path``
if none is given); vLLM always loads ``model_path`` itself and is updated through ``load_weights``.

A new engine is one decorated builder (any module imported before the run, e.g. by a plugin)::

    @ENGINES.register("my-engine")
    def _my_engine(*, model=None, model_path=None, **kwargs) -> Engine: ...

after which ``engine.name=my-engine`` validates and ``make_engine("my-engine", ...)`` builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from satrl.engines.spec import split_spec
from satrl.registry import Registry
from satrl.types import Engine

if TYPE_CHECKING:
    from torch import nn

ENGINES: Registry[Callable[..., Engine]] = Registry("engine")


@ENGINES.register("torch")
def _torch(*, model: nn.Module | None = None, model_path: str | None = None, **kwargs: Any) -> Engine:
    if model is None:
        if model_path is None:
            raise ValueError("the torch engine needs model= (an nn.Module) or model_path= (a policy to load)")
        from satrl.models import load_model

        model = load_model(model_path)
    from satrl.engines.torch_engine import TorchEngine  # here: the registry's names are checked without torch

    spec, extras = split_spec(kwargs)
    return TorchEngine(model, spec, **extras)


@ENGINES.register("vllm")
def _vllm(*, model: nn.Module | None = None, model_path: str | None = None, **kwargs: Any) -> Engine:
    # ``model`` is ignored: vLLM builds its own model from the checkpoint, then follows load_weights.
    if model_path is None:
        raise ValueError("the vllm engine loads the checkpoint itself: pass model_path= (a local HF directory)")
    from satrl.engines.vllm_engine import VLLMEngine
    from satrl.models.loading import resolve_policy_path

    spec, extras = split_spec(kwargs)
    return VLLMEngine(resolve_policy_path(model_path), spec, **extras)


# What each engine declares it can do: switch versions while it decodes (lag.inflight_every, ``generate``'s
# ``switch``), take versions through a weight-transfer API of its own (weights.transport=vllm).
_torch.inflight = True
_vllm.inflight = True
_vllm.own_transfer = True


def engines_declaring(trait: str) -> list[str]:
    """The engines whose builders declare ``trait = True``: ``inflight`` (they switch versions while they decode,
    ``Engine.generate``'s ``switch``) or ``own_transfer`` (a weight-transfer API of their own,
    :class:`~satrl.types.TransferEngine`)."""
    return [name for name, build in ENGINES.items() if getattr(build, trait, False)]


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad token id, or its EOS id when it has no pad token (many causal-LM tokenizers, e.g.
    Llama's, define none; padding positions are masked out everywhere, so any valid id serves)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token; set one in its tokenizer_config.json")
    return int(pad)


def engine_for(name: str, tokenizer: Any, **kwargs: Any) -> Engine:
    """The one way satrl builds an engine for a tokenizer: ``make_engine`` with the tokenizer's EOS and pad ids
    (:func:`pad_id`'s fallback included) and ``tokenizer`` passed on; ``kwargs`` as for :func:`make_engine`."""
    return make_engine(name, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad_id(tokenizer),
                       **kwargs)  # fmt: skip


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine ``name`` (e.g. ``make_engine("torch", model=m, eos_token_id=1, pad_token_id=0)``)."""
    return ENGINES.get(name)(**kwargs)
