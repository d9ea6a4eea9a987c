"""Objectives as named combinations of four components, and the ``policy_loss`` entry point.

An :class:`ObjectiveSpec` is a frozen choice of ratio level, trust region, correction and KL estimator plus
their hyperparameters. :func:`resolve_objective` builds one from a preset name and overrides (validated by
name: unknown keys raise ``ValueError`` listing the valid ones), so a trainer can check its config before
the first step. Presets are shorthands only; every component can also be chosen by override
(``ratio=``, ``trust_region=``, ``correction=``, ``kl=``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from satrl.tensors import as_bool_mask, clean_adv, count, masked, masked_frac, masked_mean, seq_mean

from . import offpolicy  # noqa: F401  (registers the peers' trust regions and the opsm correction)
from .corrections import CORRECTIONS
from .kl import KL_ESTIMATORS
from .ratios import RATIO_LEVELS
from .registry import Component, Registry
from .trust_regions import TRUST_REGIONS, ObjectiveInputs

SLOTS: dict[str, Registry] = {
    "ratio": RATIO_LEVELS,
    "trust_region": TRUST_REGIONS,
    "correction": CORRECTIONS,
    "kl": KL_ESTIMATORS,
}


@dataclass(frozen=True)
class Preset:
    ratio: str
    trust_region: str
    correction: str = "none"
    kl: str = "k3"  # the paper's low-variance KL, coefficient 1e-3, for every method (Appendix F)
    params: Mapping[str, Any] = field(default_factory=dict)
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
})


def available_presets() -> list[str]:
    """Names accepted by :func:`policy_loss` and :func:`resolve_objective`."""
    return PRESETS.names()


@dataclass(frozen=True)
class ObjectiveSpec:
    """A resolved objective: four component names and all their hyperparameters. Call it on tensors."""

    name: str
    ratio: str
    trust_region: str
    correction: str
    kl: str
    params: Mapping[str, Any]

    def component(self, slot: str) -> Component:
        return SLOTS[slot].get(getattr(self, slot))

    @property
    def needs(self) -> frozenset[str]:
        """The optional inputs this objective reads, as its components declare them (``ref_logp`` for a KL
        term, ``old_logp`` for a correction weighing by pi_old / mu). A KL term with ``kl_coef = 0`` needs no
        reference."""
        needs = frozenset().union(*(self.component(slot).needs for slot in SLOTS))
        if not self.params.get("kl_coef", 0) > 0:
            needs -= {"ref_logp"}
        return needs

    def slot_params(self, slot: str) -> dict[str, Any]:
        return {k: self.params[k] for k in self.component(slot).defaults}

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
        **renamed: Any,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-token loss [B, T] (0 on masked positions) and detached metrics; see :func:`policy_loss`."""
        _no_renamed(renamed)
        if renamed:
            raise TypeError(f"unexpected keyword arguments {sorted(renamed)}")
        mask = as_bool_mask(mask)
        for key, t in (("behavior_logp", behavior_logp), ("mask", mask), ("ref_logp", ref_logp),
                       ("old_logp", old_logp), ("lag", lag)):
            if t is not None and t.shape != logp.shape:
                raise ValueError(f"{key} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}")
        # Row-major copies of any other layout (no-ops when contiguous): reductions then add in the same order
        # and flat positions mean the same tokens, so results do not depend on how the inputs are stored.
        logp, behavior_logp, mask = logp.contiguous(), behavior_logp.detach().contiguous(), mask.contiguous()
        ref_logp, lag, old_logp = (None if t is None else t.contiguous() for t in (ref_logp, lag, old_logp))
        adv = adv.contiguous()
        old = logp.detach() if old_logp is None else old_logp.detach()
        denom = behavior_logp if old_logp is None else old
        adv = clean_adv(adv.detach(), mask)  # [B, 1] or [B, T], 0 where inactive

        ratio_fn = self.component("ratio").fn
        per_sequence = getattr(ratio_fn, "per_sequence", False)
        # tok_d: the token log-ratio log pi - log mu (0 on masked), for the metrics; computed once and
        # shared with the ratio level (sequence) or taken from it (token) when the denominators agree.
        tok_d = None
        if per_sequence and old_logp is None and getattr(ratio_fn, "takes_tok_d", False):
            tok_d = masked(logp.detach() - behavior_logp, mask)
            ratio, d = ratio_fn(logp, denom, mask, tok_d=tok_d)
        else:
            ratio, d = ratio_fn(logp, denom, mask)
            if old_logp is None and not per_sequence:
                tok_d = d  # reuse: same log-ratio
        abs_tok = None if tok_d is None else tok_d.abs()  # for d_pi; also SAT's |d| when tok_d is d
        inp = ObjectiveInputs(logp, denom, behavior_logp, old, mask, lag, adv,
                              abs_d=abs_tok if tok_d is d else None, n_active=torch.count_nonzero(mask))  # fmt: skip
        loss, tr_clipped, metrics = self.component("trust_region").fn(
            ratio, d, adv, mask, inp, **self.slot_params("trust_region")
        )
        weight, dropped, corr_metrics = self.component("correction").fn(inp, **self.slot_params("correction"))
        metrics.update(corr_metrics)
        clipped = tr_clipped
        if weight is not None:
            loss = loss * weight
        if dropped is not None:
            clipped = clipped | dropped

        kl_fn = self.component("kl").fn
        coef = self.params.get("kl_coef", 0.0)
        if ref_logp is not None and coef > 0:
            kl_tok = kl_fn(logp, ref_logp, mask)
            if per_sequence:
                kl_tok = seq_mean(kl_tok, mask)[:, None].expand_as(kl_tok)  # GSPO: sequence-mean KL
            loss = loss + coef * kl_tok
            metrics["kl"] = masked_mean(kl_tok.detach(), mask)

        loss = masked(loss, mask)
        metrics.update(_common_metrics(logp, denom, behavior_logp, mask, tr_clipped, old_logp is None, tok_d,
                                       abs_tok, inp.n))  # fmt: skip
        metrics.setdefault("tok/gate", torch.zeros_like(mask))
        metrics["tok/clipped"] = clipped
        return loss, metrics


@torch.no_grad()
def _common_metrics(logp, denom, behavior_logp, mask, tr_clipped, same_denom, tok_d, abs_tok=None,
                    n=None) -> dict[str, Tensor]:
    """clipfrac, ppo_kl and logratio_var (of the optimized log-ratio), d_pi and tok/d (vs mu, Eq. 52).
    ``tok_d`` / ``abs_tok``: the token log-ratio and its abs, ``n`` the active count, when the caller has them."""
    n = count(mask) if n is None else n
    if tok_d is None:
        tok_d = masked(logp.detach() - behavior_logp, mask)  # [B, T] token log-ratio log pi - log mu
        abs_tok = None
    if abs_tok is None:
        abs_tok = tok_d.abs()
    x = tok_d if same_denom else masked(logp.detach() - denom, mask)
    # tok_d and x are exactly 0 on masked positions, so plain sums are masked sums.
    mean_x = x.sum(dtype=torch.float32) / n
    return {
        "clipfrac": masked_frac(tr_clipped, mask, n),
        "ppo_kl": -mean_x,
        "d_pi": abs_tok.sum(dtype=torch.float32) / n,
        "logratio_var": (x.square().sum(dtype=torch.float32) / n - mean_x.square()).clamp(min=0.0),
        "tok/d": tok_d,
    }


def resolve_objective(name: str, **overrides: Any) -> ObjectiveSpec:
    """Validate ``name`` + ``overrides`` and return the frozen :class:`ObjectiveSpec`.

    Raises ValueError naming the valid presets, components or override keys.
    """
    if isinstance(name, ObjectiveSpec):
        base, name = name, name.name
        preset = Preset(base.ratio, base.trust_region, base.correction, base.kl, dict(base.params))
    else:
        preset = PRESETS.get(name)
    choice = {slot: overrides.pop(slot, getattr(preset, slot)) for slot in SLOTS}
    comps = {slot: SLOTS[slot].get(choice[slot]) for slot in SLOTS}
    params: dict[str, Any] = {}
    for comp in comps.values():
        params.update(comp.defaults)
    valid = sorted(set(params) | set(SLOTS))
    for key, value in {**preset.params, **overrides}.items():
        if key not in params:
            raise ValueError(
                f"unknown override {key!r} for objective {name!r} "
                f"({', '.join(f'{s}={c}' for s, c in choice.items())}); valid overrides: {valid}"
            )
        for comp in comps.values():
            if key in comp.defaults:
                comp.validate(key, value)
        params[key] = value
    return ObjectiveSpec(name, params=MappingProxyType(params), **choice)




def _no_renamed(kwargs: dict[str, Any]) -> None:
    """``versions=`` was renamed ``lag=``: a caller passing ``batch.versions`` there silently got a wrong
    version-age proxy, so the old name is an error that names the new one."""
    if "versions" in kwargs:
        raise TypeError("policy_loss: the keyword versions= is now lag= (per-token trainer version - sample "
                        "version, not Batch.versions)")


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
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token policy loss of a preset (or spec) with overrides.

    Args (all [B, T] except ``adv``, which may be [B]):
        logp: trainer log-prob of the sampled tokens; the only input that receives gradient.
        behavior_logp: engine log-prob mu. The ratio is exp(logp - behavior_logp) unless ``old_logp``
            is given, then exp(logp - old_logp); correction weights use exp(old_logp - behavior_logp).
        mask: active response tokens. Masked positions of every input may hold NaN/inf.
        ref_logp: reference log-prob; the KL term is added only when it is given.
        lag: per-token lag, trainer version - sample version (for SAT's ``proxy="version_age"``). Not
            ``Batch.versions``, which holds the sample versions themselves.
    Returns:
        loss_tok [B, T] (0 on masked positions) and metrics: 0-dim detached scalars and [B, T]
        ``tok/gate``, ``tok/clipped``, ``tok/d``.
    """
    _no_renamed(overrides)
    spec = resolve_objective(name, **overrides) if overrides or not isinstance(name, ObjectiveSpec) else name
    return spec(logp=logp, behavior_logp=behavior_logp, adv=adv, mask=mask, ref_logp=ref_logp,
                lag=lag, old_logp=old_logp)
