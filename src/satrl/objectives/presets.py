"""Objectives as named combinations of four components, and the ``policy_loss`` entry point.

An :class:`ObjectiveSpec` is a frozen, typed choice of ratio level, trust region, correction and KL estimator,
each with its hyperparameters (the component's own pydantic model, :class:`~.registry.Params`)::

    ObjectiveSpec(name="sat_grpo")                            # the preset, every value resolved
    ObjectiveSpec(name="sat_grpo", trust_region={"alpha": 0.8})
    resolve_objective("sat_grpo", alpha=0.8, kl_coef=0)       # flat keys: each goes to the one component
                                                              # that declares it (kl_coef: kl.coef)

A preset fills in the components that are not given. Unknown keys and bad values raise ``ValueError`` naming
the key, so a trainer checks its config before the first step; the run's config.yaml saves every value.

This module imports no torch (the config validates ``objective:`` with it); calling a spec computes the loss in
:mod:`satrl.objectives.loss`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from satrl.registry import did_you_mean

from .components import CORRECTIONS, KL_ESTIMATORS, RATIO_LEVELS, TRUST_REGIONS
from .registry import Component, Params, Registry, one_line

if TYPE_CHECKING:
    from torch import Tensor

    from .loss import ObjectiveOutput


@dataclass(frozen=True)
class Preset:
    ratio: str
    trust_region: str
    correction: str = "none"
    kl: str = "k3"  # the paper's low-variance KL, coefficient 1e-3, for every method (Appendix F)
    params: Mapping[str, Any] = field(default_factory=dict)  # flat keys, as resolve_objective takes them
    source: str = ""


PRESETS: Registry[Preset] = Registry("objective preset", {
    "grpo": Preset("token", "ppo", source="Shao et al. 2024; SAT paper Table 9"),
    "gspo": Preset("sequence", "ppo", source="Zheng et al. 2025 (arXiv 2507.18071); SAT paper Table 9"),
    "sat_grpo": Preset("token", "sat", source="SAT paper Eqs. 13-19"),
    "sat_gspo": Preset("sequence", "sat", source="SAT paper Eqs. 13-20"),
    "dppo_tv": Preset("token", "dppo_tv", source="Qi et al. 2026 (arXiv 2602.04879), Binary-TV"),
    "dppo_kl": Preset("token", "dppo_kl", source="Qi et al. 2026 (arXiv 2602.04879), Binary-KL"),
    "dppo_sat_paper": Preset("token", "ppo_dtv_mask", source="SAT paper App. E.4 and F, Table 9"),
    "grpo_tis": Preset("token", "ppo", "tis", source="Yao et al. 2025; SAT paper Eq. 41"),
    "gspo_tis": Preset("sequence", "ppo", "tis", source="SAT paper Table 6"),
    "sat_grpo_tis": Preset("token", "sat", "tis", source="SAT paper App. F (TIS composes with SAT)"),
    "sat_gspo_tis": Preset("sequence", "sat", "tis", source="SAT paper App. F (TIS composes with SAT)"),
    "grpo_icepop": Preset("token", "ppo", "icepop", source="Ling team 2025; SAT paper Eq. 42"),
    "grpo_mis": Preset("token", "ppo", "mis", source="masked importance sampling"),
    # the peers' off-policy objectives (satrl.objectives.offpolicy) and SAT on those with a clip interval
    "cispo": Preset("token", "cispo", source="Chen et al. 2025, MiniMax-M1 (arXiv 2506.13585), Eq. 4"),
    "sat_cispo": Preset("token", "sat_cispo", source="CISPO's interval contracted by SAT (Eqs. 13-19)"),
    "sapo": Preset("token", "sapo", source="Gao et al. 2025, SAPO (arXiv 2511.20347)"),
    "gmpo": Preset("token", "gmpo", source="Zhao et al. 2025, GMPO (arXiv 2507.20673)"),
    "sat_gmpo": Preset("token", "sat_gmpo", source="GMPO's log-space interval contracted by SAT"),
    "opsm": Preset("token", "ppo", "opsm", source="DeepSeek-AI 2025, DeepSeek-V3.2 (arXiv 2512.02556)"),
    "sat_opsm": Preset("token", "sat", "opsm", source="SAT-GRPO with DeepSeek-V3.2's sequence mask"),
    "m2po": Preset("token", "m2po", source="Zheng et al. 2025, M2PO (arXiv 2510.01161), Alg. 1, Eq. 5"),
    "vcpo": Preset("token", "ppo", "vcpo", source="Huang et al. 2026, VCPO (arXiv 2602.17616): ESS step size, OPOB"),
    # staleness repairs (satrl.objectives.repairs, .rejection): issue 33's comparators
    "m2po_official": Preset("token", "m2po_official", source="Infini-AI-Lab/M2PO repo, compute_m2po_policy_loss"),
    "decoupled_ppo": Preset("token", "ppo", "decoupled", source="Fu et al. 2025, AReaL (arXiv 2505.24298)"),
    "sat_decoupled_ppo": Preset("token", "sat", "decoupled", source="SAT on decoupled PPO's proximal ratio"),
    "a3po": Preset("token", "a3po", source="Wu et al. 2025, A-3PO (arXiv 2512.06547), AReaL's loglinear"),
    "topr": Preset("token", "topr", source="Le Roux et al. 2025, TOPR (arXiv 2503.14286), Eq. 8; ROLL"),
    "vespo": Preset("token", "vespo", source="VESPO (arXiv 2602.10693), FloyedShen/VESPO repo"),
    "grpo_geo_mask": Preset("token", "ppo", "geo_mask", source="verl 0.9.1 rollout correction, seq_mean_k1"),
    "grpo_k3_mask": Preset("token", "ppo", "kl_mask", source="verl 0.9.1 rollout correction, seq_mean_k3"),
})


def available_presets() -> list[str]:
    """Names accepted by :func:`policy_loss` and :func:`resolve_objective`."""
    return PRESETS.names()


# Flat keys whose name inside their component differs (old configs and resolve_objective's keywords). Kept as
# long as resolve_objective takes flat keywords (its public signature); a config file's flat key is refused with
# the nested name from satrl 0.2.0 on.
RENAMED = {"kl_coef": ("kl", "coef")}


class ObjectiveSpec(BaseModel):
    """A resolved objective: four components, each with its typed hyperparameters. Call it on tensors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Annotated[str, AfterValidator(PRESETS.check)] = Field(
        "grpo", description="Objective preset (satrl.objectives.available_presets()): fills the components not given."
    )
    ratio: SerializeAsAny[Params] = Field(description="Ratio level (token: GRPO/PPO; sequence: GSPO).")
    trust_region: SerializeAsAny[Params] = Field(
        description="Trust region and its radii (ppo, sat with alpha/exponent/proxy, dppo_*, cispo, ...)."
    )
    correction: SerializeAsAny[Params] = Field(description="Mismatch correction weighing by pi_old/mu (none, tis, ...).")
    kl: SerializeAsAny[Params] = Field(description="KL estimator against the reference policy, with its coefficient.")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        """The preset's components where none is given (a string is a component's name), then flat keys
        (``alpha``, ``kl_coef``: older configs and CLI overrides) moved into the component that declares them."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        preset = PRESETS.get(data.get("name", "grpo"), None)
        if preset is None:
            return data  # the name's own validator reports it, on its field
        flat = {k: data.pop(k) for k in list(data) if k not in cls.model_fields}
        for slot in SLOTS:
            given = data.get(slot)
            given = given.model_dump() if isinstance(given, Params) else given
            if not (given is None or isinstance(given, str | Mapping)):
                raise ValueError(f"{slot}: expected a component name or a mapping with a name, got {given!r}")
            given = {"name": given} if isinstance(given, str) else dict(given or {})
            given.setdefault("name", getattr(preset, slot))
            data[slot] = given
        for key, value in preset.params.items():
            slot, field_name = _owner(key, data)
            data[slot].setdefault(field_name, value)
        for key, value in flat.items():
            slot, field_name = _owner(key, data, cls.model_fields)
            data[slot][field_name] = value
        return data

    @field_validator("ratio", "trust_region", "correction", "kl", mode="before")
    @classmethod
    def _typed(cls, value: Any, info: Any) -> Params:
        """A component's mapping as the typed model its name chooses (the registry is the one list)."""
        value = value.model_dump() if isinstance(value, Params) else value
        value = {"name": value} if isinstance(value, str) else value
        if not isinstance(value, Mapping) or "name" not in value:  # the preset's defaults were not filled in
            raise ValueError(f"{info.field_name}: expected a component name or a mapping with a name, got {value!r}")
        value = dict(value)
        return SLOTS[info.field_name].get(value.pop("name")).validate(value)

    def component(self, slot: str) -> Component:
        return SLOTS[slot].get(getattr(self, slot).name)

    @property
    def needs(self) -> frozenset[str]:
        """The optional inputs this objective reads, as its components declare them (``ref_logp`` for a KL
        term, ``old_logp`` for a correction weighing by pi_old / mu). A KL term with coefficient 0 needs no
        reference."""
        needs = frozenset().union(*(self.component(slot).needs for slot in SLOTS))
        if not getattr(self.kl, "coef", 0.0) > 0:
            needs -= {"ref_logp"}
        return needs

    def components(self) -> list[tuple[Component, Params]]:
        """Each slot's chosen component with its hyperparameters, in :data:`SLOTS` order."""
        return [(self.component(slot), getattr(self, slot)) for slot in SLOTS]

    def __call__(
        self,
        *,
        logp: Tensor,
        behavior_logp: Tensor,
        adv: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None = None,
        lag: Tensor | None = None,
        old_logp: Tensor | None = None,
    ) -> ObjectiveOutput:
        """The per-token loss, metrics and per-token outputs; see :func:`policy_loss` (the tensor maths:
        :func:`satrl.objectives.loss.objective_loss`, imported here, where an objective is first computed)."""
        from .loss import objective_loss

        return objective_loss(self, logp=logp, behavior_logp=behavior_logp, adv=adv, mask=mask, ref_logp=ref_logp,
                              lag=lag, old_logp=old_logp)  # fmt: skip


SLOTS: dict[str, Registry[Component]] = {
    "ratio": RATIO_LEVELS,
    "trust_region": TRUST_REGIONS,
    "correction": CORRECTIONS,
    "kl": KL_ESTIMATORS,
}


def _owner(key: str, data: dict[str, dict], fields=()) -> tuple[str, str]:
    """(slot, field) of a flat key: the one component among ``data``'s chosen ones that declares it."""
    if key in RENAMED:
        return RENAMED[key]
    chosen = {slot: SLOTS[slot].get(data[slot]["name"]) for slot in SLOTS}
    for slot, comp in chosen.items():
        if key in comp.defaults:
            return slot, key
    # the objective's own fields (name, the four slots, a config's aggregation) are valid keys too
    valid = sorted({k for c in chosen.values() for k in c.defaults} | set(RENAMED) | set(fields))
    what = ", ".join(f"{s}={c.name}" for s, c in chosen.items())
    raise ValueError(f"unknown objective key {key!r}{did_you_mean(key, valid)} for {what}; valid keys: {valid}")


def resolve_objective(name: str | ObjectiveSpec, **overrides: Any) -> ObjectiveSpec:
    """The :class:`ObjectiveSpec` of preset ``name`` (or of a spec) with flat ``overrides`` (``alpha=0.8``,
    ``kl_coef=0``, ``trust_region="sat"``). Raises ValueError, one line, naming the key or the valid choices."""
    # a spec's own fields only (a config's ObjectiveConfig also holds its aggregation)
    base = name.model_dump(include=set(ObjectiveSpec.model_fields)) if isinstance(name, ObjectiveSpec) else {"name": name}
    for slot in SLOTS:  # a component chosen by name replaces the base's (and its hyperparameters)
        if slot in overrides:
            base[slot] = overrides.pop(slot)
    try:
        return ObjectiveSpec.model_validate({**base, **overrides})
    except ValidationError as err:
        raise ValueError(one_line(err, "objective: ")) from None


def policy_loss(
    name: str | ObjectiveSpec,
    *,
    logp: Tensor,
    behavior_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    lag: Tensor | None = None,
    old_logp: Tensor | None = None,
    **overrides: Any,
) -> ObjectiveOutput:
    """Per-token policy loss of a preset (or spec) with flat overrides.

    Args (all [B, T] except ``adv``, which may be [B]):
        logp: trainer log-prob of the sampled tokens; the only input that receives gradient.
        behavior_logp: engine log-prob mu. The ratio is exp(logp - behavior_logp) unless ``old_logp``
            is given, then exp(logp - old_logp); correction weights use exp(old_logp - behavior_logp).
        mask: active response tokens. Masked positions of every input may hold NaN/inf.
        ref_logp: reference log-prob; the KL term is added only when it is given.
        lag: per-token lag, trainer version - sample version (for SAT's ``proxy="version_age"``).
    Returns:
        :class:`ObjectiveOutput`: ``loss`` [B, T] (0 on masked positions), ``metrics`` (0-dim detached
        scalars) and ``tokens`` (:class:`TokenOutputs`: ``d``, ``gate``, ``clipped``, [B, T]).
    """
    spec = resolve_objective(name, **overrides) if overrides or not isinstance(name, ObjectiveSpec) else name
    return spec(logp=logp, behavior_logp=behavior_logp, adv=adv, mask=mask, ref_logp=ref_logp,
                lag=lag, old_logp=old_logp)
