"""Rollout engines: generate completions with a (possibly stale) policy and report exactly what they sampled.

``TorchEngine`` (any HF causal LM, CPU or GPU) implements :class:`satrl.types.Engine`; ``make_engine``
builds an engine by its name in the :data:`ENGINES` registry (``"torch"``; ``"vllm"`` with the extra,
:mod:`satrl.engines.vllm_engine`); :data:`NUMERICS` holds the engine numerics.

Names are imported when first asked for (as in :mod:`satrl.experiments`), so that a light module of this package
(``satrl.engines.numerics``: ``satrl eval --help`` reads its default) does not pull in torch and transformers.
"""

from types import ModuleType

from satrl.lazy import names_from


def _module(name: str) -> ModuleType:
    """The engines module ``name``, imported when one of its names is first asked for (import statements, so the
    import graph sees each)."""
    match name:
        case "numerics":
            from satrl.engines import numerics as module
        case "registry":
            from satrl.engines import registry as module
        case "sampling":
            from satrl.engines import sampling as module
        case "spec":
            from satrl.engines import spec as module
        case _:
            from satrl.engines import torch_engine as module
    return module


_WHERE = {"NUMERICS": "numerics", "resolve_numerics": "numerics", "ENGINES": "registry", "make_engine": "registry",
          "request_uniforms": "sampling", "sample_step": "sampling", "sampling_logprobs": "sampling",
          "truncate_logits": "sampling", "EngineSpec": "spec", "TorchEngine": "torch_engine"}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
