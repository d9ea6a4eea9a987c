"""Rollout engines: generate completions with a (possibly stale) policy and report exactly what they sampled.

``TorchEngine`` (any HF causal LM, CPU or GPU) implements :class:`satrl.types.Engine`; ``make_engine``
builds an engine by its name in the :data:`ENGINES` registry (``"torch"``; ``"vllm"`` with the extra,
:mod:`satrl.engines.vllm_engine`); :data:`NUMERICS` holds the engine numerics.
"""

from satrl.engines.numerics import NUMERICS, resolve_numerics
from satrl.engines.registry import ENGINES, make_engine
from satrl.engines.sampling import request_uniforms, sample_step, sampling_logprobs, truncate_logits
from satrl.engines.spec import EngineSpec
from satrl.engines.torch_engine import TorchEngine

__all__ = [
    "ENGINES",
    "EngineSpec",
    "NUMERICS",
    "TorchEngine",
    "make_engine",
    "request_uniforms",
    "resolve_numerics",
    "sample_step",
    "sampling_logprobs",
    "truncate_logits",
]
