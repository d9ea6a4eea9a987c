"""The body of satrl's verl policy losses: what :mod:`satrl.integrations.verl` runs on a loss call.

:mod:`satrl.integrations.verl` is the module verl imports at ``import verl`` (its ``verl.plugins`` entry
point), in every verl process, so it imports almost nothing: it registers light stubs (its ``LOSS_FNS``) when
verl's ``core_algos`` is imported and they import this module, with ``satrl.objectives`` and verl's config
classes, on their first call (see docs/integrations.md, "Import cost"). Everything here is re-exported by
:mod:`satrl.integrations.verl` (``from satrl.integrations.verl import SatPolicyLossConfig`` works, and so does
verl's ``_target_=satrl.integrations.verl.SatPolicyLossConfig``).

Each loss has verl's policy-loss signature ``(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)``, where every tensor is [B, T]:

    loss_tok, m, tokens = satrl.objectives.policy_loss(preset, logp=log_prob, behavior_logp=old_log_prob,
                                               adv=advantages, mask=response_mask, ...)   # [B, T]
    loss = verl agg_loss(loss_tok * rollout_is_weights, response_mask, loss_agg_mode, **global_batch_info)

So SAT's d is log pi_theta - log old_log_prob: whatever verl's trainer puts in ``old_log_probs`` is
SAT's mu. With ``algorithm.rollout_correction.bypass_mode=true`` and
``actor_rollout_ref.rollout.calculate_log_probs=true`` (v1 trainer) that is the rollout engine's log-probs,
the paper's mu; in decoupled mode it is the recomputed pi_old, with verl's ``rollout_is_weights`` as the TIS
factor. The loss cannot tell which (verl passes no rollout log-probs to a policy loss), so the driver
declares it: ``sat_mu='${satrl_mu:}'`` (see ``_verl_mu``), logged as ``actor/sat_mu_is_rollout``.

Config: the radii come from verl's ``ActorConfig`` exactly as verl's ``vanilla`` reads them
(``clip_ratio_low``/``clip_ratio_high``, falling back to ``clip_ratio``), plus ``clip_ratio_c`` (dual clip)
for the token-level losses. SAT's own keys live in ``config.policy_loss`` (see
:class:`SatPolicyLossConfig`). With ``sat_alpha=1.0`` the gate is empty and ``sat``/``sat_gspo`` equal
verl's ``vanilla``/``gspo`` (tested bit for bit). Departure from verl's ``gspo``: satrl clamps the mean
sequence log-ratio to [-20, 20] where verl clamps it above at 10 (a ratio of e^10, far outside any clip).

The gate's quantile is over what one call receives: one micro-batch on one rank. A sequence-level gate
can gate a sequence only when its tokens are at most n - ceil(alpha * n) of the call's n tokens, so with
few sequences per micro-batch it never fires; the plug-in warns once per process when a call's
composition rules the gate out (see :func:`gate_capacity` and docs/integrations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor
from verl.trainer.ppo import core_algos
from verl.workers.config import PolicyLossConfig

from satrl.integrations._gate import composition, gate_capacity, warn_gate_cannot_fire
from satrl.integrations._verl_mu import MU_OVERRIDE, MU_VALUES, mu_flag
from satrl.integrations._verl_variants import BODY_NAMES, VARIANTS
from satrl.objectives import ObjectiveOutput, ObjectiveSpec, resolve_objective
from satrl.objectives.sat import LAG_FREE_PROXIES

# verl's own policy losses read these (see core_algos.compute_policy_loss_vanilla); same fallbacks here.
DEFAULT_CLIP_RATIO_C = 3.0
# How to give SAT's gate more tokens per loss call in verl (see docs/integrations.md).
VERL_HINT = (
    "pack more sequences per micro-batch (actor.use_dynamic_bsz=true with a larger "
    "ppo_max_token_len_per_gpu) or lower sat_alpha"
)
# verl's vanilla clamps the log-ratio to this before its ppo_kl metric (core_algos.compute_policy_loss_vanilla).
PPO_KL_CLAMP = 20.0
# satrl keys in ``actor.policy_loss`` and their defaults (the paper's, and satrl's ``sat`` trust region's).
SAT_KEYS: dict[str, Any] = {"sat_alpha": 0.9, "sat_exponent": 2.0, "sat_proxy": None, "sat_invert": None}
# ``version_age`` needs per-token lags, which verl does not pass to policy losses.
VERL_PROXIES = LAG_FREE_PROXIES


@dataclass
class SatPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus SAT's keys, so hydra accepts them in ``actor.policy_loss``.

    verl builds ``actor.policy_loss`` with ``PolicyLossConfig(**keys)``, which rejects unknown keys; set
    ``actor_rollout_ref.actor.policy_loss._target_=satrl.integrations.verl.SatPolicyLossConfig`` to use these.

    Args:
        sat_alpha: quantile level alpha of SAT's gate (paper Eq. 14); 1.0 turns the gate off.
        sat_exponent: kernel exponent p of psi(u; q) = 1 / (1 + (u/q)^p) (paper Eq. 16).
        sat_proxy: gate score, ``log_ratio`` (paper) or ``prob_diff``; None = the loss_mode's choice.
        sat_invert: gate the bottom tail instead of the top; None = the loss_mode's choice.
        sat_mu: what verl's ``old_log_probs`` are, ``rollout`` (bypass mode) or ``old_policy`` (decoupled);
            write ``'${satrl_mu:}'`` so the driver fills it in from the trainer's config. None = undeclared
            (logged as -1, with a warning).
    """

    sat_alpha: float = SAT_KEYS["sat_alpha"]
    sat_exponent: float = SAT_KEYS["sat_exponent"]
    # Optional[...] rather than `X | None`: OmegaConf's structured configs cannot read the union syntax.
    sat_proxy: Optional[str] = None
    sat_invert: Optional[bool] = None
    sat_mu: Optional[str] = None

    def __post_init__(self):
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        if self.sat_mu is not None and self.sat_mu not in MU_VALUES:  # refused when verl builds the config
            raise ValueError(
                f"actor.policy_loss.sat_mu={self.sat_mu!r}; choose one of {list(MU_VALUES)} "
                f"or write {MU_OVERRIDE}"
            )


def _get(cfg: Any, key: str, default: Any) -> Any:
    """``cfg.key`` for verl's dataclass configs, OmegaConf DictConfigs and plain dicts alike."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def _choice(variant_value: Any, config_value: Any, key: str, loss_mode: str, default: Any) -> Any:
    """The loss_mode's choice, unless the config sets one; a contradiction is an error, not a silent pick."""
    if config_value is None:
        return variant_value
    if variant_value != default and config_value != variant_value:
        raise ValueError(
            f"loss_mode={loss_mode} already sets {key.removeprefix('sat_')}={variant_value!r} but "
            f"actor.policy_loss.{key}={config_value!r}; drop the key or pick another sat loss_mode"
        )
    return config_value


def objective_from_config(loss_mode: str, config: Any) -> ObjectiveSpec:
    """The satrl objective that ``loss_mode`` runs under verl's actor ``config`` (validated).

    Radii exactly as verl's ``vanilla``: ``clip_ratio_low``/``clip_ratio_high`` or else ``clip_ratio``;
    dual clip ``clip_ratio_c`` for token-level modes only (verl's ``gspo`` has none).
    Raises ValueError naming the valid choices for unknown modes or bad values.
    """
    v = VARIANTS.get(loss_mode)
    if config is None:
        raise ValueError(f"loss_mode={loss_mode} needs verl's actor config (config=ActorConfig(...))")
    clip_ratio = _get(config, "clip_ratio", 0.2)
    eps_low = _get(config, "clip_ratio_low", clip_ratio)
    eps_high = _get(config, "clip_ratio_high", clip_ratio)
    dual_clip = None if v.per_sequence else _get(config, "clip_ratio_c", DEFAULT_CLIP_RATIO_C)
    pl = _get(config, "policy_loss", None)
    proxy = _choice(v.proxy, _get(pl, "sat_proxy", None), "sat_proxy", loss_mode, "log_ratio")
    invert = _choice(v.invert, _get(pl, "sat_invert", None), "sat_invert", loss_mode, False)
    if proxy not in VERL_PROXIES:
        raise ValueError(
            f"actor.policy_loss.sat_proxy={proxy!r} is not available in verl; "
            f"choose one of {list(VERL_PROXIES)} (verl passes no per-token lags)"
        )
    return resolve_objective(
        v.preset,
        eps_low=float(eps_low),
        eps_high=float(eps_high),
        dual_clip=None if dual_clip is None else float(dual_clip),
        alpha=float(_get(pl, "sat_alpha", SAT_KEYS["sat_alpha"])),
        exponent=float(_get(pl, "sat_exponent", SAT_KEYS["sat_exponent"])),
        proxy=proxy,
        invert=bool(invert),
    )


# SAT's runtime diagnostics (paper Table 10) under verl metric names that say how verl reduces them.
# verl 0.9.1's ppo_loss wraps every policy-loss metric as Metric(MEAN): the logged value is the mean over
# micro-batches and dp ranks of each call's value; across mini-batches reduce_metrics takes np.min /
# np.max of keys containing "min" / "max" and the mean of the rest. No policy loss can ask for another
# reduction (Metric.from_dict refuses a Metric of another aggregation), so the names say "microbatch_mean"
# and avoid the substrings "min"/"max": a mean of micro-batch minima must not be called a minimum.
SAT_METRICS = {
    "actor/sat_q_microbatch_mean": "q",
    "actor/sat_gate_rate_microbatch_mean": "gate_rate",
    "actor/sat_eps_low_microbatch_mean": "eps_low_mean",
    "actor/sat_eps_high_microbatch_mean": "eps_high_mean",
    "actor/sat_c_lowest_microbatch_mean": "c_min",
}
MU_METRIC = "actor/sat_mu_is_rollout"  # 1: mu = the engine's log-probs, 0: pi_old, -1: undeclared


@torch.no_grad()
def verl_metrics(
    out: ObjectiveOutput,
    adv: Tensor,
    mask: Tensor,
    per_sequence: bool,
    extra: dict[str, Tensor] | None = None,
) -> dict[str, float]:
    """verl's three policy-loss metrics (same keys and meaning as ``vanilla``/``gspo``) plus SAT's.

    ``actor/pg_clipfrac``: tokens clipped at an endpoint of the (SAT-contracted) interval;
    ``actor/pg_clipfrac_lower``: tokens cut by the dual clip (A < 0, r > clip_ratio_c; 0 for GSPO, as verl);
    ``actor/ppo_kl``: mean of -clamp(log pi - log old, -20, 20) over active tokens, as verl's ``vanilla``.
    ``actor/sat_abs_d_microbatch_mean``: mean |log pi - log mu| over the call's active tokens (d̄_π).
    ``extra`` 0-dim tensors ride along in the same single host sync.
    """
    m, d = out.metrics, out.tokens.d
    mask = mask.bool()
    n = torch.count_nonzero(mask).clamp(min=1).to(torch.float32)
    if per_sequence:
        lower = torch.zeros((), device=mask.device)
    else:
        # Low clipping needs r < 1 (d < 0), so clipped A < 0 tokens with d > 0 are the dual-clipped ones.
        dual = out.tokens.clipped & (adv < 0) & (d > 0) & mask
        lower = torch.count_nonzero(dual).to(torch.float32) / n
    # d is 0 on masked positions, so plain sums are masked sums.
    ppo_kl = -d.clamp(-PPO_KL_CLAMP, PPO_KL_CLAMP).sum(dtype=torch.float32) / n
    values = {
        "actor/pg_clipfrac": m["clipfrac_high"] + m["clipfrac_low"],
        "actor/ppo_kl": ppo_kl,
        "actor/pg_clipfrac_lower": lower,
        **{key: m[name] for key, name in SAT_METRICS.items()},
        "actor/sat_abs_d_microbatch_mean": d.abs().sum(dtype=torch.float32) / n,
        **(extra or {}),
    }
    floats = torch.stack([v.to(torch.float32) for v in values.values()]).tolist()  # one host sync
    return dict(zip(values, floats))


def sat_policy_loss(
    loss_mode: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """One verl policy-loss call of ``loss_mode`` (see the module docstring). All tensors [B, T]."""
    spec = objective_from_config(loss_mode, config)
    out = spec(logp=log_prob, behavior_logp=old_log_prob, adv=advantages, mask=response_mask)
    loss_tok = out.loss
    if rollout_is_weights is not None:
        loss_tok = loss_tok * rollout_is_weights  # as verl's vanilla: weights multiply the per-token loss
    batch_info = _get(config, "global_batch_info", None) or {}
    loss = core_algos.agg_loss(
        loss_mat=loss_tok, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info
    )
    # The gate moves whole sequences only when it ranks sequence scores (prob_diff is token-level).
    per_sequence = VARIANTS[loss_mode].per_sequence and spec.trust_region.proxy == "log_ratio"
    metrics = verl_metrics(
        out, advantages, response_mask, VARIANTS[loss_mode].per_sequence, extra=composition(response_mask)
    )
    metrics[MU_METRIC] = mu_flag(_get(_get(config, "policy_loss", None), "sat_mu", None), loss_mode)
    n, shortest = int(metrics.pop("n")), int(metrics.pop("shortest"))
    alpha = spec.trust_region.alpha
    m_budget = gate_capacity(n, shortest, alpha, per_sequence)
    if m_budget is not None:
        warn_gate_cannot_fire(f"loss_mode={loss_mode}", n, shortest, m_budget, alpha, per_sequence, VERL_HINT)
    return loss, metrics


__all__ = list(BODY_NAMES)  # one list with the plug-in's lazy re-exports (tests/integrations/test_verl_lazy_names.py)
