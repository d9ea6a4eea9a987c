"""SAT's gate scores ("proxies"): what the gate ranks instead of |d| (:mod:`satrl.objectives.sat`, option
``proxy``). Each is ``fn(inp) -> [B, T] | None`` (None: |d| itself, the paper). Their registry, with what each needs
beyond the log-probs, is :data:`satrl.objectives.params.SAT_PROXIES`, which imports this module when a score is
first computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from satrl.tensors import masked

if TYPE_CHECKING:
    from torch import Tensor

    from .trust_regions import ObjectiveInputs


def log_ratio_score(inp: ObjectiveInputs) -> Tensor | None:
    """|d| (the paper): None, so sat_gate ranks |d|."""
    return None


def prob_diff_score(inp: ObjectiveInputs) -> Tensor:
    """|pi - mu| of the sampled token."""
    return masked((inp.logp.detach().exp() - inp.denom_logp.exp()).abs(), inp.mask)


def version_age_score(inp: ObjectiveInputs) -> Tensor:
    """The token's lag (trainer version - sample version)."""
    if inp.lag is None:
        raise ValueError("SAT proxy='version_age' needs lag= (the per-token lag); pass it or use "
                         "proxy='log_ratio'")
    return masked(inp.lag.to(inp.logp.dtype), inp.mask)
