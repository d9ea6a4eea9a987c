"""The loss_modes satrl registers in verl: a leaf both the plug-in (:mod:`satrl.integrations.verl`) and its
config guards (:mod:`satrl.integrations._verl_mu`) read, so that neither imports the other. Imports no verl."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from satrl.registry import Registry


@dataclass(frozen=True)
class Variant:
    """One registered loss_mode: a satrl preset plus the gate's score and tail."""

    preset: str
    proxy: str = "log_ratio"
    invert: bool = False
    default_agg: str = "token-mean"

    @property
    def per_sequence(self) -> bool:
        """Whether the preset's ratio is one per sequence (GSPO's), as the ratio component declares."""
        return _per_sequence(self.preset)


@functools.cache
def _per_sequence(preset: str) -> bool:
    from satrl.objectives import resolve_objective

    return bool(resolve_objective(preset).component("ratio").traits.get("per_sequence"))


VARIANTS: Registry[Variant] = Registry("satrl loss_mode", {
    "sat": Variant("sat_grpo"),
    "sat_invert": Variant("sat_grpo", invert=True),
    "sat_prob_diff": Variant("sat_grpo", proxy="prob_diff"),
    # verl's own gspo defaults to seq-mean-token-mean; the actor always passes its loss_agg_mode anyway.
    "sat_gspo": Variant("sat_gspo", default_agg="seq-mean-token-mean"),
    "sat_gspo_invert": Variant("sat_gspo", invert=True, default_agg="seq-mean-token-mean"),
    "sat_gspo_prob_diff": Variant("sat_gspo", proxy="prob_diff", default_agg="seq-mean-token-mean"),
})
