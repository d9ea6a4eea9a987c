"""The loss_modes satrl registers in verl: a leaf both the plug-in (:mod:`satrl.integrations.verl`) and its
config guards (:mod:`satrl.integrations._verl_mu`) read, so that neither imports the other. Imports no verl.

Also the loss body's public names (:data:`BODY_NAMES`), written once here: the body's ``__all__`` and the
plug-in's lazy re-exports are both this list, and the plug-in cannot read it from the body without importing it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from satrl.registry import Registry

# The public names of the loss body (satrl.integrations._verl_loss): its __all__, and the names the plug-in
# satrl.integrations.verl re-exports, importing the body on first access.
BODY_NAMES = (
    "DEFAULT_CLIP_RATIO_C",
    "MU_METRIC",
    "PPO_KL_CLAMP",
    "SAT_KEYS",
    "SAT_METRICS",
    "VERL_HINT",
    "VERL_PROXIES",
    "SatPolicyLossConfig",
    "composition",
    "gate_capacity",
    "objective_from_config",
    "sat_policy_loss",
    "verl_metrics",
)


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
