"""satrl.objectives: pure tensor RL objectives (GRPO, GSPO, SAT, DPPO, TIS/IcePop/MIS, CISPO, SAPO, GMPO,
M2PO, OPSM, KL, and the staleness repairs: decoupled PPO, A-3PO, TOPR, VESPO, M2PO's official clip, verl's
rejection masks).

```python
from satrl.objectives import sat_clip_bounds, clipped_surrogate, policy_loss, aggregate, available_presets

lo, hi, metrics, gate = sat_clip_bounds(d, mask, eps_low=0.2, eps_high=0.2, alpha=0.9, exponent=2.0)
loss_tok = clipped_surrogate(ratio, adv, lo, hi, dual_clip=None)
out = policy_loss("sat_grpo", logp=logp, behavior_logp=blp, adv=adv, mask=mask)   # .loss, .metrics, .tokens
loss = aggregate(out.loss, mask, "token-mean")
```
See docs/objectives.md for every preset's formula, defaults and sources.

Names are imported when first asked for (as in :mod:`satrl.engines`): the registries, the components'
hyperparameters and the presets (:mod:`.components`, :mod:`.params`, :mod:`.presets`) import no torch, so that a
config's ``objective:`` section is checked without it; the tensor modules load when an objective is computed.
"""

from types import ModuleType

from satrl.lazy import names_from


def _module(name: str) -> ModuleType:
    """The objectives module ``name``, imported when one of its names is first asked for (import statements, so the
    import graph sees each)."""
    match name:
        case "_common":
            from satrl.objectives import _common as module
        case "components":
            from satrl.objectives import components as module
        case "loss":
            from satrl.objectives import loss as module
        case "presets":
            from satrl.objectives import presets as module
        case "registry":
            from satrl.objectives import registry as module
        case "sat":
            from satrl.objectives import sat as module
        case _:
            from satrl.objectives import trust_regions as module
    return module


_WHERE = {"LOG_RATIO_CLAMP": "_common", "AGGREGATIONS": "components", "CORRECTIONS": "components",
          "KL_ESTIMATORS": "components", "RATIO_LEVELS": "components", "TRUST_REGIONS": "components",
          "aggregate": "components", "ObjectiveOutput": "loss", "TokenOutputs": "loss", "PRESETS": "presets",
          "ObjectiveSpec": "presets", "available_presets": "presets", "policy_loss": "presets",
          "resolve_objective": "presets", "Params": "registry", "kth_smallest": "sat", "quantile_rank": "sat",
          "sat_clip_bounds": "sat", "ObjectiveInputs": "trust_regions", "clipped_surrogate": "trust_regions"}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
