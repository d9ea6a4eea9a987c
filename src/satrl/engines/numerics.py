"""How an engine's copy of the weights differs from the trainer's fp32 (``engine.numerics``): one table for every
engine, so that ``bf16`` means the same rounding in the torch engine and in vLLM.

- ``fp32``: none (the engine computes as the trainer does);
- ``bf16``: bf16 weights and compute;
- ``bf16-weights``: weights rounded to bf16, fp32 compute: a realistic implementation mismatch at fp32 speed on
  CPUs without bf16 units (the torch engine's default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from satrl.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_NUMERICS", "EVAL_NUMERICS", "NUMERICS", "Numerics", "resolve_numerics"]


@dataclass(frozen=True)
class Numerics:
    """Compute dtype of the engine's model and the dtype its weights are rounded through, by torch's names
    (``"bfloat16"``): the table is read when a config is checked, which imports no torch."""

    compute_name: str
    weights_name: str

    @property
    def compute(self) -> torch.dtype:
        import torch

        return getattr(torch, self.compute_name)

    @property
    def weights(self) -> torch.dtype:
        import torch

        return getattr(torch, self.weights_name)

    @property
    def rounds(self) -> bool:
        """Whether weights pass through a narrower dtype than the engine computes in (``bf16-weights``)."""
        return self.weights_name != self.compute_name


NUMERICS: Registry[Numerics] = Registry("numerics", {
    "fp32": Numerics("float32", "float32"),
    "bf16": Numerics("bfloat16", "bfloat16"),
    "bf16-weights": Numerics("float32", "bfloat16"),
})

# The one default of each kind: a rollout engine's (``engine.numerics``, a worker's spec, an engine whose spec names
# none, torch or vLLM alike): a mismatch with the fp32 trainer, as real engines have; and an evaluation's (``satrl
# eval``, pretraining's scores): the trainer's own numerics, so a score measures the policy, not the rounding.
DEFAULT_NUMERICS = "bf16-weights"
EVAL_NUMERICS = "fp32"


def resolve_numerics(name: str) -> Numerics:
    """The :class:`Numerics` of ``name`` (``engine.numerics``); :class:`~satrl.registry.UnknownChoice` otherwise."""
    return NUMERICS.get(name)
