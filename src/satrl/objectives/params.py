"""Every objective component's hyperparameters: typed, documented, range-checked pydantic models (subclasses of
:class:`~satrl.objectives.registry.Params`), and the registry of SAT's gate score (:data:`SAT_PROXIES`), which the
gate's ``proxy`` field is checked against.

They are what a config's ``objective:`` section is validated by, so they live apart from the tensor functions they
parametrize and import no torch: a misspelt key or an out-of-range value is reported before torch is imported
(issue 56). :mod:`satrl.objectives.components` names each component with its model; the tensor functions (one
module per family, each with its formulas) take the values as keyword arguments.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from .registry import Deferred, Params, component_registry


# ------------------------------------------------------------------------------------------ SAT's gate score
def _score(name: str) -> Deferred:
    """The gate score ``name`` of :mod:`satrl.objectives.proxies` (tensors), imported when first computed."""

    def load():
        from satrl.objectives import proxies

        return getattr(proxies, name)

    return Deferred(load)


# SAT's gate score ("proxy"): what the gate ranks instead of |d|. Each is ``fn(inp) -> [B, T] | None`` (None:
# |d| itself) and declares what it needs beyond the log-probs (``lag``: integrations that pass no per-token
# lags offer only the others).
SAT_PROXIES = component_registry("SAT proxy")
SAT_PROXIES.register("log_ratio", _score("log_ratio_score"))
SAT_PROXIES.register("prob_diff", _score("prob_diff_score"))
SAT_PROXIES.register("version_age", _score("version_age_score"), needs=("lag",))


# ----------------------------------------------------------------------- KL estimators (satrl.objectives.kl)
class KLCoef(Params):
    """The KL term's weight in the loss."""

    coef: float = Field(1e-3, ge=0, le=100, description="Coefficient of the per-token KL term (paper App. F: 1e-3), "
                        "in [0, 100]; 0 drops the term and the reference model.")  # fmt: skip


# ---------------------------------------------- PPO's clip and DPPO's masks (satrl.objectives.trust_regions)
class ClipRadii(Params):
    """PPO's clip interval [1 - eps_low, 1 + eps_high] (the paper's defaults, Appendix F)."""

    eps_low: float = Field(0.2, ge=0, le=1, description="Lower radius: the ratio's lower bound is 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0, description="Upper radius: the upper bound is 1 + eps_high.")
    dual_clip: float | None = Field(
        None, gt=1, description="Dual clip c > 1 (Ye et al. 2020): the loss of A < 0 tokens is at most -c A; null: off."
    )


class DPPOTV(Params):
    """DPPO-Binary-TV's threshold (Qi et al. 2026)."""

    delta: float = Field(0.15, ge=0, description="Mask outward tokens with |pi - mu| above this.")


class DPPOKL(Params):
    """DPPO-Binary-KL's threshold (Qi et al. 2026)."""

    delta: float = Field(0.05, ge=0, description="Mask outward tokens with the Bernoulli KL(mu || pi) above this.")


class DTVMask(ClipRadii):
    """The SAT paper's DPPO baseline: PPO's radii and the TV threshold (Appendix E.4, F)."""

    delta: float = Field(1e-3, ge=0, description="Mask outward tokens with |pi - mu| above this.")


# ------------------------------------------------------------------------- SAT's gate (satrl.objectives.sat)
class GateParams(Params):
    """SAT's gate and kernel (Eqs. 14-16), and the controls of the falsification grid."""

    alpha: float = Field(0.9, ge=0, le=1, description="Gate quantile (Eq. 14): tokens whose score exceeds the "
                         "alpha-quantile q of the call's active tokens are contracted.")  # fmt: skip
    exponent: float = Field(2.0, gt=0, description="p in the kernel psi(u; q) = 1 / (1 + (u/q)^p) (Eq. 16).")
    proxy: Annotated[str, AfterValidator(SAT_PROXIES.check)] = Field(
        "log_ratio", description="What the gate ranks: log_ratio (|d|, the paper), prob_diff (|pi - mu|) or "
        "version_age (the token's lag).",
    )  # fmt: skip
    invert: bool = Field(False, description="Control: gate the bottom tail instead, with the same budget.")
    shuffle: bool = Field(False, description="Control: move the gated slots and their kernel values to random "
                          "active tokens.")  # fmt: skip


class SATParams(GateParams, ClipRadii):
    """SAT: PPO's radii, contracted per token by the gate."""


# --------------------------------------------- the peers' off-policy objectives (satrl.objectives.offpolicy)
class CISPORadii(Params):
    """CISPO's weight cap [1 - eps_low, 1 + eps_high] (MiniMax-M1: no lower bound; ScaleRL/TRL: capped at 5)."""

    eps_low: float = Field(1.0, ge=0, le=1, description="The weight's lower bound is 1 - eps_low (1: none).")
    eps_high: float = Field(4.0, ge=0, description="The weight's upper bound is 1 + eps_high.")


class GMPORadii(Params):
    """GMPO's log-space interval (-eps_low, eps_high) (GMPO Sec. 4: ratios clipped to (e^-0.4, e^0.4))."""

    eps_low: float = Field(0.4, ge=0, le=1, description="Log-ratio lower bound -eps_low.")
    eps_high: float = Field(0.4, ge=0, description="Log-ratio upper bound eps_high.")


class SATCISPO(GateParams, CISPORadii):
    """CISPO's interval contracted per token by SAT's gate."""


class SATGMPO(GateParams, GMPORadii):
    """GMPO's log-space interval contracted per token by SAT's gate."""


class SAPOTemperatures(Params):
    """SAPO's gate temperatures (Gao et al. 2025)."""

    tau_pos: float = Field(1.0, gt=0, description="Temperature for tokens with A > 0.")
    tau_neg: float = Field(1.05, gt=0, description="Temperature for tokens with A < 0.")


class M2POThreshold(Params):
    """M2PO's second-moment bound (Zheng et al. 2025, Algorithm 1)."""

    m2_threshold: float = Field(0.04, ge=0, description="tau_M2: the kept tokens' mean d^2 is at most this.")


class OPSMThreshold(Params):
    """OPSM's threshold (DeepSeek-V3.2 gives no value; TRL suggests 0.5)."""

    opsm_delta: float = Field(0.5, ge=0, description="Drop A < 0 responses whose mean log(mu / pi) exceeds this.")


# ------------------------------------------------------- mismatch corrections (satrl.objectives.corrections)
class Level(Params):
    """Where the weight k = pi_old / mu is taken."""

    correction_level: Literal["token", "sequence"] = Field(
        "token", description="token: k per token; sequence: the response's geometric mean of k on every token."
    )


class TIS(Level):
    """Truncated importance sampling (Yao et al. 2025)."""

    tis_cap: float = Field(2.0, gt=0, description="C: the weight is min(k, C).")


class IcePop(Level):
    """IcePop (Ling team 2025)."""

    icepop_low: float = Field(0.5, gt=0, description="a: tokens with k < a are dropped.")
    icepop_high: float = Field(2.0, gt=0, description="b: tokens with k > b are dropped.")
    icepop_weighted: bool = Field(False, description="Weigh kept tokens by k (the paper's Eq. 42) instead of 1.")

    @model_validator(mode="after")
    def _ordered(self):  # a > b keeps no token: loss and gradient 0 on every step (issue 46)
        if self.icepop_low >= self.icepop_high:
            raise ValueError(f"icepop_low {self.icepop_low} must be below icepop_high {self.icepop_high}")
        return self


class MIS(Level):
    """Masked importance sampling."""

    mis_threshold: float = Field(2.0, gt=0, description="C: the weight is k where k <= C, else 0.")


# -------------------------------------------------------------- staleness repairs (satrl.objectives.repairs)
class BehaviourCap(Params):
    """Decoupled PPO's cap on the behaviour weight pi_prox / mu (AReaL)."""

    behav_imp_weight_cap: float = Field(
        5.0, gt=1, description="C: the cap on the behaviour weight k = pi_prox / mu (AReaL's configs: 5)."
    )
    behav_imp_weight_mode: Literal["mask", "truncate"] = Field(
        "mask", description="mask: weight 0 where k > C (AReaL's default); truncate: min(k, C)."
    )


class BehaviourWeight(BehaviourCap, Level):
    """Decoupled PPO's behaviour weight, per token or the response's geometric mean (AReaL's levels)."""


class A3POParams(BehaviourCap, ClipRadii):
    """A-3PO: PPO's radii and decoupled PPO's cap, on a proximal policy interpolated by version."""

    prox_lag: int = Field(
        1, ge=0, description="v_theta - v_prox in versions: 1 is AReaL's code (alpha = (lag - 1) / lag); 0 "
        "makes pi_prox = pi_theta (alpha = 1), the exact proximal policy with one optimizer step per batch.",
    )  # fmt: skip


class TOPRWeights(Params):
    """TOPR's weights on the two sets (ROLL's ``topr_positive_weight`` / ``topr_negative_weight``)."""

    topr_positive_weight: float = Field(1.0, ge=0, description="c+: the weight of A > 0 tokens (no IS).")
    topr_negative_weight: float = Field(1.0, ge=0, description="c-: the weight of A <= 0 tokens, times clip(r, 0, 1).")


class VESPOKernel(Params):
    """VESPO's kernel phi(w) = e^lambda w^k e^(-lambda w), one (k, lambda) per advantage sign."""

    k_pos: float = Field(2.0, ge=0, description="k where the response's advantage is >= 0.")
    lambda_pos: float = Field(3.0, ge=1e-4, description="lambda where the response's advantage is >= 0.")
    k_neg: float = Field(3.0, ge=0, description="k where the response's advantage is < 0.")
    lambda_neg: float = Field(2.0, ge=1e-4, description="lambda where the response's advantage is < 0.")


class M2POBudget(Params):
    """The official M2PO repo's second-moment budget and clip floors (``compute_m2po_policy_loss``)."""

    m2_budget: float = Field(0.04, gt=0, description="B: the harmful tokens' mean min(d^2, tau^2) is kept under B.")
    miniclip_low: float | None = Field(
        0.3, ge=0, le=1, description="Floor on the lower radius (the interval's low end is at most 1 - this); "
        "null: none, as the repo's scripts ran.",
    )  # fmt: skip
    miniclip_high: float | None = Field(
        0.5, ge=0, description="Floor on the upper radius (the high end is at least 1 + this); null: none."
    )


# ------------------------------------------------------- verl's rejection masks (satrl.objectives.rejection)
class GeoMask(Params):
    """verl's k1 rejection: the (mean) log-ratio within log-bounds (``*_k1``; defaults ``decoupled_geo_rs``)."""

    geo_level: Literal["token", "seq_sum", "seq_mean"] = Field(
        "seq_mean", description="token_k1, seq_sum_k1 or seq_mean_k1 (the geometric mask, verl's default)."
    )
    geo_low: float = Field(0.999, gt=0, description="Keep where the statistic is >= log(low) (ratio mu / pi_old).")
    geo_high: float = Field(1.001, gt=0, description="Keep where the statistic is <= log(high) (ratio mu / pi_old).")

    @model_validator(mode="after")
    def _ordered(self):
        if self.geo_low > self.geo_high:
            raise ValueError(f"geo_low {self.geo_low} must be <= geo_high {self.geo_high}")
        return self


class KLMask(Params):
    """verl's k2/k3 rejection: the statistic at most a threshold (``*_k2``, ``*_k3``; defaults ``decoupled_k3_rs``)."""

    kl_estimator: Literal["k2", "k3"] = Field("k3", description="k2 = lr^2 / 2 or k3 = e^lr - 1 - lr per token.")
    kl_level: Literal["token", "seq_sum", "seq_mean", "seq_max"] = Field(
        "seq_mean", description="Per token, or the response's sum, mean or max (verl's K3-RS: seq_mean)."
    )
    kl_threshold: float = Field(0.01, gt=0, description="Keep where the statistic is <= this (verl's default 0.01).")


# ------------------------------------------------------------------------------ VCPO (satrl.objectives.vcpo)
class VCPOParams(Params):
    """VCPO's step-size rule and baseline (mit-han-lab/vcpo defaults and recipes)."""

    ess_rule: Literal["sqrt", "linear"] = Field(
        "sqrt", description="lr multiplier: sqrt(min(1, ESS/B / ess_base_ratio)) (Adam-style, VCPO's) or linear."
    )
    ess_base_ratio: float = Field(1.0, gt=0, le=1, description="rho_0: ESS/B at and above which the lr is unscaled.")
    ess_weight_cap: float | None = Field(
        None, gt=0, description="C: ESS over min(w_i, C) instead of w_i (VCPO's use_clipped); null: uncapped."
    )
    ess_step: bool = Field(
        True, description="Control 1, the ESS step size, on (VCPO) or off (the base lr on every step; the baseline "
        "alone).",
    )  # fmt: skip
    baseline: Literal["opob", "opob_unweighted", "group_mean"] = Field(
        "opob", description="Control 2. opob: VCPO's off-policy optimal baseline, W_i = w_i^2 ||grad log pi(tau_i)||^2 "
        "(one extra batched forward+backward per batch); opob_unweighted: the same with w_i = 1 (the classic "
        "gradient-norm-weighted baseline, no importance weights); group_mean: GRPO's advantages unchanged.",
    )  # fmt: skip
