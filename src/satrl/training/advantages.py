"""Advantage baselines, as pure functions of tensors (chosen by name in :mod:`satrl.training.baselines`).

Every one subtracts a baseline from each response's reward R_i, with statistics over the responses of its prompt
group g (groups may have different sizes: async drops), and with ``std_norm`` (``train.adv_std_norm``, Dr. GRPO's
switch, Liu et al. 2025, arXiv 2503.20783) divides by sigma_g + 1e-6, sigma_g the group's population reward std:

- :func:`group_advantages` (``group_mean``, GRPO, Shao et al. 2024): b_g = mean_g R.
- :func:`constant_offset_advantages` (``constant_offset``): b_g = max(mean_g R - c, min_g R).
- :func:`rloo_advantages` (``rloo``, Ahmadian et al. 2024, arXiv 2402.14740; verl's
  ``compute_rloo_vectorized_outcome_advantage``): b_i = mean of the group's other rewards.
- :func:`optimal_token_baseline` (``otb``, arXiv 2602.07078; verl's ``compute_optimal_token_baseline_advantage``):
  a baseline per token position, [B, T].
- OPOB (``opob``, VCPO): :func:`satrl.objectives.vcpo.opob_advantages`, which lives with VCPO's other control.

A group whose rewards are all equal (min_g R = max_g R) gets advantage 0 under every baseline here but OTB's without
``std_norm`` (verl's numbers): it then carries no gradient, as under GRPO. The ``*_rule`` functions at the end are
what the registry calls: ``rule(inp: AdvantageInputs, *, std_norm, **params) -> (adv, metrics)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AdvantageInputs",
    "constant_offset_advantages",
    "group_advantages",
    "optimal_token_baseline",
    "rloo_advantages",
    "rollout_is_weights",
]

EPS = 1e-6  # GRPO's, in sigma_g + EPS (DeepSeekMath, verl's epsilon)


def _groups(group_index: Tensor) -> tuple[Tensor, int]:
    """(each row's group 0..G-1, G)."""
    _, inv = torch.unique(group_index, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def _sum(x: Tensor, inv: Tensor, n_groups: int) -> Tensor:
    """Per group, the sum of ``x``'s rows ([B] -> [G], [B, T] -> [G, T])."""
    return torch.zeros((n_groups, *x.shape[1:]), dtype=x.dtype, device=x.device).index_add_(0, inv, x)


def _extreme(x: Tensor, inv: Tensor, n_groups: int, how: str) -> Tensor:  # [G]
    """Per group, the min (``amin``) or max (``amax``) of ``x`` [B] (every group has a row)."""
    return torch.zeros(n_groups, dtype=x.dtype, device=x.device).scatter_reduce(
        0, inv, x, how, include_self=False
    )


def _all_equal(rewards: Tensor, inv: Tensor, n_groups: int) -> Tensor:  # [B] bool
    """Rows whose group's rewards are all equal (exactly: min = max, whatever the rounding of their mean)."""
    return (_extreme(rewards, inv, n_groups, "amin") == _extreme(rewards, inv, n_groups, "amax"))[inv]


def _std_scaled(adv: Tensor, rewards: Tensor, inv: Tensor, n_groups: int, eps: float) -> Tensor:
    """``adv`` ([B] or [B, T]) / (sigma_g + eps), sigma_g the population std of the group's rewards."""
    count = _sum(torch.ones_like(rewards), inv, n_groups)
    centered = rewards - (_sum(rewards, inv, n_groups) / count)[inv]
    sigma = (_sum(centered.square(), inv, n_groups) / count).sqrt()[inv]
    return adv / (sigma.reshape(-1, *([1] * (adv.dim() - 1))) + eps)


def group_advantages(
    rewards: Tensor,  # [B]
    group_index: Tensor,  # [B] int, samples of one prompt share an index
    std_norm: bool = True,
    eps: float = EPS,
) -> Tensor:  # [B]
    """A_i = (R_i - mean_g R) / (std_g R + eps), statistics over the samples of i's group (GRPO).

    The std is the population std (as in DeepSeekMath's GRPO and verl). A group whose rewards are all equal
    gets zero advantage, so it contributes no gradient. Groups may have different sizes (async drops).
    """
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, rewards) / count
    centered = rewards - mean[inv]
    if not std_norm:
        return centered
    var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, centered.square()) / count
    return centered / (var.sqrt()[inv] + eps)


@torch.no_grad()
def constant_offset_advantages(rewards: Tensor, group_index: Tensor, c: float, std_norm: bool = True,
                               eps: float = EPS) -> Tensor:  # fmt: skip
    """A_i = R_i - b_g, b_g = max(mean_g R - c, min_g R); / (sigma_g + eps) with ``std_norm``. [B] -> [B].

    The baseline sits c (>= 0, reward units) below GRPO's group mean, so a response up to c worse than the mean
    still counts as better than expected, but never below the group's worst reward, so the worst response is never
    pushed up. A group whose rewards are all equal gets 0 (mean = min: b_g = R), as under OPOB and GRPO.
    """
    inv, G = _groups(group_index)
    count = _sum(torch.ones_like(rewards), inv, G)
    b = torch.maximum(_sum(rewards, inv, G) / count - c, _extreme(rewards, inv, G, "amin"))
    adv = torch.where(_all_equal(rewards, inv, G), 0.0, rewards - b[inv])
    return _std_scaled(adv, rewards, inv, G, eps) if std_norm else adv


@torch.no_grad()
def rloo_advantages(rewards: Tensor, group_index: Tensor, std_norm: bool = True, eps: float = EPS) -> Tensor:
    """REINFORCE leave-one-out: A_i = R_i - (sum_g R - R_i) / (n_g - 1) = (n_g R_i - sum_g R) / (n_g - 1),
    0 in a group of one; / (sigma_g + eps) with ``std_norm`` (verl's RLOO never divides). [B] -> [B].

    Ahmadian et al. 2024 (arXiv 2402.14740), as verl 0.9.1 computes it (``compute_rloo_vectorized_outcome_advantage``:
    the same expression and order of operations). It is n/(n-1) times GRPO's centred reward, so it sums to 0 over
    every group; a group whose rewards are all equal gets exactly 0.
    """
    inv, G = _groups(group_index)
    n = _sum(torch.ones_like(rewards), inv, G)[inv]
    adv = ((n * rewards - _sum(rewards, inv, G)[inv]) / (n - 1).clamp_min(1)) * (n > 1)
    adv = torch.where(_all_equal(rewards, inv, G), 0.0, adv)
    return _std_scaled(adv, rewards, inv, G, eps) if std_norm else adv


@torch.no_grad()
def rollout_is_weights(old_logp: Tensor, behavior_logp: Tensor, mask: Tensor, level: str,
                       threshold: float) -> Tensor:  # fmt: skip
    """verl's truncated rollout importance weights (``compute_rollout_correction_weights``, TIS): [B, T],
    min(exp(clamp(log pi_old - log mu, +-20)), threshold) per token (``token``), or of the sum of the row's
    log-ratios broadcast over it (``sequence``); 0 on masked positions."""
    m = mask.to(old_logp.dtype)
    log_ratio = old_logp - behavior_logp
    if level == "sequence":
        log_ratio = (log_ratio * m).sum(-1, keepdim=True).expand_as(log_ratio)
    return (torch.exp(log_ratio.clamp(-20.0, 20.0)) * m).clamp(max=threshold)


@torch.no_grad()
def optimal_token_baseline(
    rewards: Tensor,  # [B] outcome reward
    group_index: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool, active response tokens
    old_logp: Tensor,  # [B, T] log pi_old(y_t) at the batch's first weights
    sum_pi_sq: Tensor,  # [B, T] sum_v pi_old(v | s_t)^2 over the vocabulary
    is_weights: Tensor | None = None,  # [B, T] truncated rollout importance weights, or None
    handle_zero_tail: bool = True,
    std_norm: bool = False,
    eps: float = 1e-8,
) -> Tensor:  # [B, T]
    """The optimal token baseline (OTB, arXiv 2602.07078; verl 0.9.1's ``compute_optimal_token_baseline_advantage``)::

        G_it = sum_{s >= t} r_is        the return: R_i at every active token up to the response's last
        w_it = (1 - 2 pi_old(y_it) + sum_v pi_old(v)^2) * rho_it^2      ||d log pi(y_t)/d logits||^2, a forward-only
                                        proxy of the token's squared gradient norm; rho: is_weights (1 if None)
        W_it = sum_{s <= t} w_is mask_is                                the path's accumulated variance proxy
        B_gt = sum_{i in g} G_it W_it mask_it / (sum_{i in g} W_it mask_it + eps)    (0 in a group of one)
        A_it = (G_it - B_gt) mask_it

    With ``handle_zero_tail`` the one longest response of a group (where it is longer than every other) gets B = 0
    from column L_2 on, L_2 the group's second-longest length (verl's default). ``std_norm`` (not verl's) divides by
    sigma_g + 1e-6 and gives 0 to a group whose rewards are all equal, as GRPO does; verl's numbers are
    ``std_norm=False``, where such a group keeps R * eps / W on its shared positions and R on a zero tail.
    """
    dt = old_logp.dtype
    m = mask.to(dt)
    inv, G = _groups(group_index)
    B, T = mask.shape
    col = torch.arange(T, device=mask.device)
    last = torch.where(mask, col + 1, 0).amax(1) - 1  # each row's last active column (-1: none)
    token_r = torch.zeros(B, T, dtype=dt, device=mask.device)
    has = last >= 0
    token_r[has, last[has]] = rewards.to(dt)[has]
    returns = (token_r * m).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * torch.exp(old_logp) + sum_pi_sq
    if is_weights is not None:
        w = w * is_weights**2
    W = (w * m).cumsum(-1)
    base = (_sum(returns * W * m, inv, G) / (_sum(W * m, inv, G) + eps))[inv]  # [B, T]
    count = _sum(torch.ones(B, dtype=dt, device=mask.device), inv, G)[inv]
    base = torch.where(count[:, None] > 1, base, 0.0)
    if handle_zero_tail:
        length = mask.sum(1)
        top = _extreme(length, inv, G, "amax")[inv]
        alone = (_sum((length == top).to(dt), inv, G)[inv] == 1) & (length == top) & (count > 1)
        second = _extreme(torch.where(length == top, -1, length), inv, G, "amax")[inv]
        base = torch.where(alone[:, None] & (col[None] >= second[:, None]), 0.0, base)
    adv = (returns - base) * m
    if not std_norm:
        return adv
    R = rewards.to(dt)
    return torch.where(_all_equal(R, inv, G)[:, None], 0.0, _std_scaled(adv, R, inv, G, EPS))


# ------------------------------------------------------------------------------------------------ the rules
@dataclass(frozen=True)
class AdvantageInputs:
    """What a baseline may read; the trainer fills what its registry entry ``needs`` (else None)."""

    rewards: Tensor  # [B]
    group_index: Tensor  # [B] int
    mask: Tensor  # [B, T] bool
    behavior_logp: Tensor  # [B, T] log mu, the engine's
    log_w: Tensor | None = None  # [B] sum_t log pi/mu (needs score_norms)
    score_sq: Tensor | None = None  # [B] ||grad log pi(tau_i)||^2 (needs score_norms)
    old_logp: Tensor | None = None  # [B, T] log pi_old(y_t) (needs token_probs)
    sum_pi_sq: Tensor | None = None  # [B, T] sum_v pi_old(v)^2 (needs token_probs)


Out = tuple[Tensor, dict[str, Tensor]]


def group_mean_rule(inp: AdvantageInputs, *, std_norm: bool) -> Out:
    return group_advantages(inp.rewards, inp.group_index, std_norm), {}


def constant_offset_rule(inp: AdvantageInputs, *, std_norm: bool, c: float) -> Out:
    return constant_offset_advantages(inp.rewards, inp.group_index, c, std_norm), {}


def rloo_rule(inp: AdvantageInputs, *, std_norm: bool) -> Out:
    return rloo_advantages(inp.rewards, inp.group_index, std_norm), {}


def otb_rule(inp: AdvantageInputs, *, std_norm: bool, handle_zero_tail: bool, rollout_is: str,
             rollout_is_threshold: float) -> Out:  # fmt: skip
    rho = None
    if rollout_is != "none":
        rho = rollout_is_weights(inp.old_logp, inp.behavior_logp.to(inp.old_logp.dtype), inp.mask, rollout_is,
                                 rollout_is_threshold)  # fmt: skip
    adv = optimal_token_baseline(inp.rewards, inp.group_index, inp.mask, inp.old_logp, inp.sum_pi_sq, rho,
                                 handle_zero_tail, std_norm)  # fmt: skip
    return adv.to(inp.rewards.dtype), {}


def opob_rule(inp: AdvantageInputs, *, std_norm: bool) -> Out:
    from satrl.objectives.vcpo import opob_advantages

    return opob_advantages(inp.rewards, inp.group_index, inp.log_w, inp.score_sq, std_norm)


def opob_unweighted_rule(inp: AdvantageInputs, *, std_norm: bool) -> Out:
    from satrl.objectives.vcpo import opob_unweighted_advantages

    return opob_unweighted_advantages(inp.rewards, inp.group_index, inp.log_w, inp.score_sq, std_norm)
