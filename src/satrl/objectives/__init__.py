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
"""

from . import vcpo  # noqa: F401, E402  (registers the vcpo correction; imports the seam in .step_size)
from ._common import LOG_RATIO_CLAMP
from .aggregation import AGGREGATIONS, aggregate
from .corrections import CORRECTIONS
from .kl import KL_ESTIMATORS
from .presets import (
    PRESETS,
    ObjectiveOutput,
    ObjectiveSpec,
    TokenOutputs,
    available_presets,
    policy_loss,
    resolve_objective,
)
from .ratios import RATIO_LEVELS
from .registry import Params
from .sat import kth_smallest, quantile_rank, sat_clip_bounds
from .trust_regions import TRUST_REGIONS, ObjectiveInputs, clipped_surrogate

__all__ = [
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "PRESETS",
    "RATIO_LEVELS",
    "TRUST_REGIONS",
    "ObjectiveInputs",
    "ObjectiveOutput",
    "ObjectiveSpec",
    "Params",
    "TokenOutputs",
    "aggregate",
    "available_presets",
    "clipped_surrogate",
    "kth_smallest",
    "policy_loss",
    "quantile_rank",
    "resolve_objective",
    "sat_clip_bounds",
]
