"""The objectives' registries: every component a preset composes (ratio level, trust region, correction, KL
estimator) and the loss aggregations, each declared once with its hyperparameter model (:mod:`.params`), the
optional inputs it reads (``needs``) and its traits.

Each registry is the one list of its kind's valid names (the config checks ``objective.*`` against them). A
component's function stays in its tensor module, with its formulas; it is registered here as :class:`Deferred`, by
the module it lives in and its name, and imported when the component is first called. So a config is validated,
and every component's defaults and declarations read, without importing torch (issue 56); the tensor modules import
neither this module nor :mod:`.presets`, which reads it.

A component of one's own (a plugin) is one more ``register`` call, with its function itself or deferred::

    @TRUST_REGIONS.register("my_clip", params=MyRadii)
    def my_clip(ratio, d, adv, mask, inp, *, eps) -> Region: ...
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from .params import (
    DPPOKL,
    DPPOTV,
    MIS,
    SATCISPO,
    SATGMPO,
    TIS,
    A3POParams,
    BehaviourWeight,
    CISPORadii,
    ClipRadii,
    DTVMask,
    GeoMask,
    GMPORadii,
    IcePop,
    KLCoef,
    KLMask,
    M2POBudget,
    M2POThreshold,
    OPSMThreshold,
    SAPOTemperatures,
    SATParams,
    TOPRWeights,
    VCPOParams,
    VESPOKernel,
)
from .registry import Deferred, component_registry

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["AGGREGATIONS", "CORRECTIONS", "KL_ESTIMATORS", "RATIO_LEVELS", "TRUST_REGIONS", "aggregate", "share_unit"]


def _module(name: str) -> ModuleType:
    """The tensor module ``name`` (it imports torch), imported when one of its components is first called (import
    statements, so the import graph sees each)."""
    match name:
        case "aggregation":
            from satrl.objectives import aggregation as module
        case "corrections":
            from satrl.objectives import corrections as module
        case "kl":
            from satrl.objectives import kl as module
        case "offpolicy":
            from satrl.objectives import offpolicy as module
        case "ratios":
            from satrl.objectives import ratios as module
        case "rejection":
            from satrl.objectives import rejection as module
        case "repairs":
            from satrl.objectives import repairs as module
        case "sat":
            from satrl.objectives import sat as module
        case "vcpo":
            from satrl.objectives import vcpo as module
        case _:
            from satrl.objectives import trust_regions as module
    return module


def _in(module: str, fn: str) -> Deferred:
    """The function ``fn`` of the tensor module ``module``, found when first called."""
    return Deferred(lambda: getattr(_module(module), fn))


# ---------------------------------------------------------------------------------------------- ratio levels
# fn(logp, denom_logp, mask) -> (ratio, d)  (satrl.objectives.ratios)
RATIO_LEVELS = component_registry("ratio level")
RATIO_LEVELS.register("token", _in("ratios", "token_ratio"), traits={"per_sequence": False})
# a per-sequence ratio: the objective then broadcasts the KL as a sequence mean
RATIO_LEVELS.register("sequence", _in("ratios", "sequence_ratio"), traits={"per_sequence": True})

# ---------------------------------------------------------------------------------------------- trust regions
# fn(ratio, d, adv, mask, inp, **params) -> Region  (satrl.objectives.trust_regions)
TRUST_REGIONS = component_registry("trust region")
TRUST_REGIONS.register("ppo", _in("trust_regions", "ppo_trust_region"), params=ClipRadii)
TRUST_REGIONS.register("dppo_tv", _in("trust_regions", "dppo_tv_trust_region"), params=DPPOTV)
TRUST_REGIONS.register("dppo_kl", _in("trust_regions", "dppo_kl_trust_region"), params=DPPOKL)
TRUST_REGIONS.register("ppo_dtv_mask", _in("trust_regions", "ppo_dtv_mask_trust_region"), params=DTVMask)
TRUST_REGIONS.register("sat", _in("sat", "sat_trust_region"), params=SATParams)
# the peers' off-policy objectives, and SAT on those with a clip interval
TRUST_REGIONS.register("cispo", _in("offpolicy", "cispo_trust_region"), params=CISPORadii)
TRUST_REGIONS.register("sat_cispo", _in("offpolicy", "sat_cispo_trust_region"), params=SATCISPO)
TRUST_REGIONS.register("sapo", _in("offpolicy", "sapo_trust_region"), params=SAPOTemperatures)
TRUST_REGIONS.register("gmpo", _in("offpolicy", "gmpo_trust_region"), params=GMPORadii)
TRUST_REGIONS.register("sat_gmpo", _in("offpolicy", "sat_gmpo_trust_region"), params=SATGMPO)
TRUST_REGIONS.register("m2po", _in("offpolicy", "m2po_trust_region"), params=M2POThreshold)
# staleness repairs
TRUST_REGIONS.register("a3po", _in("repairs", "a3po_trust_region"), params=A3POParams, needs=("lag",))
TRUST_REGIONS.register("topr", _in("repairs", "topr_trust_region"), params=TOPRWeights)
TRUST_REGIONS.register("vespo", _in("repairs", "vespo_trust_region"), params=VESPOKernel)
TRUST_REGIONS.register("m2po_official", _in("repairs", "m2po_official_trust_region"), params=M2POBudget)


# ------------------------------------------------------------------------------------------------ corrections
# fn(inp, **params) -> (weight, dropped, metrics)  (satrl.objectives.corrections); those that weigh by
# k = pi_old / mu need old_logp.
def _vcpo_step_size(**params: Any) -> Any:
    """The ``vcpo`` correction's ``step_size`` trait (:func:`satrl.objectives.vcpo.step_size_rule`)."""
    return _module("vcpo").step_size_rule(**params)


def _vcpo_baseline(**params: Any) -> Any:
    """The ``vcpo`` correction's ``advantage`` trait (:func:`satrl.objectives.vcpo.baseline_rule`)."""
    return _module("vcpo").baseline_rule(**params)


CORRECTIONS = component_registry("correction")
CORRECTIONS.register("none", _in("corrections", "no_correction"))
CORRECTIONS.register("tis", _in("corrections", "tis_correction"), params=TIS, needs=("old_logp",))
CORRECTIONS.register("icepop", _in("corrections", "icepop_correction"), params=IcePop, needs=("old_logp",))
CORRECTIONS.register("mis", _in("corrections", "mis_correction"), params=MIS, needs=("old_logp",))
CORRECTIONS.register("opsm", _in("offpolicy", "opsm_correction"), params=OPSMThreshold, needs=("old_logp",))
CORRECTIONS.register("decoupled", _in("repairs", "decoupled_correction"), params=BehaviourWeight,
                     needs=("old_logp",))  # fmt: skip
CORRECTIONS.register("geo_mask", _in("rejection", "geo_mask_correction"), params=GeoMask, needs=("old_logp",))
CORRECTIONS.register("kl_mask", _in("rejection", "kl_mask_correction"), params=KLMask, needs=("old_logp",))
CORRECTIONS.register("vcpo", _in("vcpo", "vcpo_correction"), params=VCPOParams,
                     traits={"step_size": _vcpo_step_size, "advantage": _vcpo_baseline})  # fmt: skip

# --------------------------------------------------------------------------------------------- KL estimators
# fn(logp, ref_logp, mask) -> the per-token term  (satrl.objectives.kl)
KL_ESTIMATORS = component_registry("KL estimator")
KL_ESTIMATORS.register("none", _in("kl", "no_kl"))
KL_ESTIMATORS.register("k1", _in("kl", "kl_k1"), params=KLCoef, needs=("ref_logp",))
KL_ESTIMATORS.register("k2", _in("kl", "kl_k2"), params=KLCoef, needs=("ref_logp",))
KL_ESTIMATORS.register("k3", _in("kl", "kl_k3"), params=KLCoef, needs=("ref_logp",))

# ---------------------------------------------------------------------------------------------- aggregations
# fn(loss_tok, mask, horizon) -> the 0-dim loss  (satrl.objectives.aggregation); ``share``: what a microbatch's
# share of a minibatch counts
AGGREGATIONS = component_registry("aggregation mode")
AGGREGATIONS.register("token-mean", _in("aggregation", "token_mean"), traits={"share": "token"})
AGGREGATIONS.register("seq-mean-token-mean", _in("aggregation", "seq_mean_token_mean"), traits={"share": "sequence"})
AGGREGATIONS.register("seq-mean-token-sum", _in("aggregation", "seq_mean_token_sum"), traits={"share": "sequence"})
AGGREGATIONS.register("seq-mean-token-sum-norm", _in("aggregation", "seq_mean_token_sum_norm"),
                      traits={"share": "sequence"})  # fmt: skip


def aggregate(loss_tok: Tensor, mask: Tensor, mode: str = "token-mean", horizon: int | None = None) -> Tensor:
    """Reduce a per-token loss [B, T] to a 0-dim loss; ``mode`` is one of :data:`AGGREGATIONS`."""
    from satrl.tensors import as_bool_mask

    return AGGREGATIONS.get(mode).fn(loss_tok, as_bool_mask(mask), horizon)


def share_unit(mode: str) -> str:
    """``"token"`` or ``"sequence"``: what a microbatch's share of a minibatch counts under ``mode``, so that
    gradient accumulation over microbatches equals one large batch (declared by each aggregation)."""
    return AGGREGATIONS.get(mode).traits["share"]
