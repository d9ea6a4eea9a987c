"""VCPO's two variance controls for stale rollouts, as the correction ``vcpo`` (preset ``vcpo``).

Huang, Zhang, Hu, Yang, Han 2026, "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (arXiv
2602.17616; code github.com/mit-han-lab/vcpo). Stale rollouts make the sequence importance weights heavy-tailed,
so a few sequences carry each update. VCPO answers with two controls, neither of which changes the per-token loss
(the correction's weight is 1 on every token, so ``vcpo`` composes with any ratio level and trust region):

1. **ESS-guided step size** (:func:`ess_step_scale`, through the trainer's step-size seam,
   :mod:`satrl.objectives.step_size`). Over the B sequences of the minibatch that have an active token::

       log w_i = sum_t (log pi_theta(y_it) - log mu(y_it))        the product of the token ratios, in log space
       ESS = (sum_i w_i)^2 / sum_i w_i^2,   rho = ESS / B  in [1/B, 1]
       lr_step = lr * sqrt(min(1, rho / rho_0))      (ess_rule=sqrt, rho_0 = ess_base_ratio = 1)
                 lr * min(1, rho / rho_0)            (ess_rule=linear)

   ``ess_weight_cap`` C replaces w_i by min(w_i, C) in ESS (their ``use_clipped``; off, as in their recipes).
2. **Off-policy optimal baseline, OPOB** (:func:`opob_advantages`, as the objective's advantage rule). Per
   prompt group g, the baseline that minimizes the variance of the importance-weighted gradient estimate::

       W_i = w_i^2 ||grad_theta log pi_theta(tau_i)||^2,     log pi(tau_i) = sum_t log pi(y_it)
       b_g = sum_{i in g} W_i R_i / sum_{i in g} W_i
       A_i = (R_i - b_g) / (sigma_g + 1e-6)   (train.adv_std_norm; sigma_g the group's population reward std)
             R_i - b_g                        (adv_std_norm=false)

   The trainer measures each ||grad log pi(tau_i)||^2 and log w_i at the batch's first weights (pi_old), before
   the advantages, with one batched forward and one backward per microbatch that forms no weight gradient
   (:mod:`satrl.training.score_norms`: ghost norms, exact; docs/benchmarks.md, "VCPO cost").
   ``baseline=group_mean`` keeps GRPO's advantages (the ESS step size alone) and skips that pass;
   ``baseline=opob_unweighted`` takes w_i = 1 (the gradient-norm-weighted baseline, no importance weights), and
   ``ess_step=false`` turns control 1 off: each control is a switch of its own (issue 48's factorial).

What their code does, and what we do (read at mit-han-lab/vcpo, ``verl/workers/actor/megatron_actor.py``:
``_optimizer_step_with_buffer``, ``_update_grad_buffers``, ``_compute_grad_norms``; and
``recipe/fully_async_policy/staleness_utils.py``: ``compute_is_info``, ``compute_ess_info``,
``compute_opob_baseline``):

- w_i is ``exp(sum_t (old_log_prob - rollout_log_prob))`` over the response mask: the raw product of token
  ratios pi_old / mu, not length-normalized and not clamped; ESS is taken over the whole minibatch (all
  data-parallel ranks), with 1e-8 added to sum w^2. We take d at the step's own forward (pi_theta / mu), which
  is pi_old / mu on the first optimizer step of a batch (the only one with ``train.minibatches=1,
  ppo_epochs=1``) and equals their ``skip_recompute_old_log_prob`` path on later ones; we compute ESS in log
  space (exp(2 logsumexp(log w) - logsumexp(2 log w))), which cannot overflow, without the 1e-8.
- The scale multiplies each param group's lr for one ``optimizer.step()`` and is undone after it; rule sqrt,
  base ratio 1.0 and unclipped weights are their defaults and every recipe's setting.
- OPOB: scope ``group`` (a prompt's responses), ``agg_mode=mean``, IS weights unclipped and squared, no length
  normalization, rewards divided by the group std (``norm_by_std``) in their recipes. Their grad norm is that of
  each trajectory's own loss with advantage 1, which carries the loss's other per-sequence weights (their recipes
  add a sequence-level truncated IS weight min(w, 8), a rollout correction GRPO here does not have); we use the
  paper's ||grad log pi(tau_i)||. They compute it per minibatch while accumulating; we compute it once per batch
  (the same thing with one optimizer step per batch). A group whose W are all 0 (0/0) gets the group mean here
  (their eps-guarded mean gives 0); sum W is normalized in log space, so w^2 cannot overflow.
- Their recipes also turn the PPO clip off (clip_ratio_low 1, high 1e9) and weigh each response by
  min(w_i, 8); the ``vcpo`` preset keeps GRPO's token ratio over mu and its clip, per issue 33 ("GRPO plus
  these"), so that it differs from ``grpo`` by the two controls only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .step_size import StepInputs, StepSize
from .trust_regions import ObjectiveInputs

__all__ = ["effective_sample_size", "ess_step_scale", "opob_advantages", "opob_shift", "sequence_log_weights"]


@torch.no_grad()
def sequence_log_weights(d: Tensor, mask: Tensor) -> Tensor:  # [B] float64
    """log w_i = sum_t d_it over active tokens: the log of the product of the token ratios (d [B, T], mask [B, T])."""
    return torch.where(mask, d.to(torch.float64), 0.0).sum(1)


@torch.no_grad()
def effective_sample_size(log_w: Tensor, valid: Tensor) -> Tensor:  # 0-dim float64
    """ESS = (sum_i w_i)^2 / sum_i w_i^2 over the ``valid`` [B] rows, from log w [B]: exp(2 LSE(log w) -
    LSE(2 log w)), scale-free, so no weight overflows. Between 1 and the number of valid rows; NaN if none."""
    lw = torch.where(valid, log_w.to(torch.float64), float("-inf"))
    return torch.exp(2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0))


@torch.no_grad()
def ess_step_scale(
    d: Tensor, mask: Tensor, *, ess_rule: str = "sqrt", ess_base_ratio: float = 1.0, ess_weight_cap: float | None = None
) -> StepSize:
    """VCPO's learning-rate multiplier for one optimizer step (module docstring, control 1).

    Args: ``d`` [B, T] log pi - log mu per token (detached), ``mask`` [B, T] bool. B counts the rows with an
    active token. Returns :class:`StepSize`: the 0-dim float64 scale (1 when no row is active), and metrics
    ``ess`` and ``ess_ratio`` (ESS / B).
    """
    valid = mask.any(1)
    log_w = sequence_log_weights(d, mask)
    if ess_weight_cap is not None:
        log_w = log_w.clamp(max=float(torch.log(torch.tensor(ess_weight_cap, dtype=torch.float64))))
    n = valid.sum().to(torch.float64)
    ess = effective_sample_size(log_w, valid)
    ratio = torch.where(n > 0, ess / n.clamp(min=1.0), 1.0)
    frac = (ratio / ess_base_ratio).clamp(max=1.0)
    scale = frac.sqrt() if ess_rule == "sqrt" else frac
    return StepSize(scale, {"ess": torch.where(n > 0, ess, 0.0), "ess_ratio": ratio})


@torch.no_grad()
def opob_advantages(
    rewards: Tensor,  # [B]
    group_index: Tensor,  # [B] int, the responses of one prompt share an index
    log_w: Tensor,  # [B] log pi(tau_i) / mu(tau_i)
    score_sq: Tensor,  # [B] ||grad_theta log pi(tau_i)||^2
    std_norm: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """VCPO's off-policy optimal baseline (module docstring, control 2): A_i = (R_i - b_g) / (sigma_g + eps),
    b_g = sum_g W_i R_i / sum_g W_i, W_i = w_i^2 score_sq_i. Returns ``(adv [B] in rewards' dtype, metrics)``,
    metrics ``opob_shift``: the mean over sequences of |b_g - mean_g R| (0 where W is uniform in every group), and
    ``opob_shift_signed``: the mean of b_g - mean_g R (> 0: the baseline moved up, so more responses count as
    worse than expected).

    Written as GRPO's centred reward minus a weighted mean of the centred rewards, so that uniform W gives GRPO's
    advantages (to rounding) and a group whose rewards are all equal gets exactly 0, as under GRPO. W is
    normalized per group in log space (log W_i = 2 log w_i + log score_sq_i). A group whose W are all 0 gets the
    plain group mean (0/0; VCPO's eps-guarded mean would give b_g = 0). Non-finite inputs give non-finite
    advantages, which the trainer's guard turns into a skipped step.
    """
    f64 = torch.float64
    centered, shift, inv, count = _opob(rewards, group_index, log_w, score_sq)
    adv = centered - shift
    if std_norm:
        var = torch.zeros(count.numel(), dtype=f64, device=centered.device).index_add_(0, inv, centered.square()) / count
        adv = adv / (var.sqrt()[inv] + eps)
    zero = torch.zeros((), dtype=f64)
    return adv.to(rewards.dtype), {"opob_shift": shift.abs().mean() if count.numel() else zero,
                                   "opob_shift_signed": shift.mean() if count.numel() else zero}  # fmt: skip


@torch.no_grad()
def opob_shift(rewards: Tensor, group_index: Tensor, log_w: Tensor, score_sq: Tensor) -> Tensor:  # [B] float64
    """Per row, its group's b_g - mean_g R: the amount :func:`opob_advantages` subtracts from GRPO's centred reward
    (same arguments; 0 where W is uniform in the group, to rounding). For a framework that centres and scales the
    rewards itself (the TRL plug-in, :mod:`satrl.integrations.trl_vcpo`)."""
    return _opob(rewards, group_index, log_w, score_sq)[1]


def _opob(rewards: Tensor, group_index: Tensor, log_w: Tensor, score_sq: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(R - mean_g R, b_g - mean_g R per row, group of each row, group sizes), float64: the shared part of
    :func:`opob_advantages` and :func:`opob_shift`."""
    f64 = torch.float64
    R = rewards.to(f64)
    dev = R.device
    _, inv = torch.unique(group_index, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(G, dtype=f64, device=dev).index_add_(0, inv, torch.ones_like(R))
    centered = R - (torch.zeros(G, dtype=f64, device=dev).index_add_(0, inv, R) / count)[inv]
    log_W = 2 * log_w.to(f64) + score_sq.to(f64).log()
    top = torch.full((G,), float("-inf"), dtype=f64, device=dev).scatter_reduce(0, inv, log_W, "amax")
    p = torch.where(top[inv] == float("-inf"), 1.0, torch.exp(log_W - top[inv]))
    z = torch.zeros(G, dtype=f64, device=dev).index_add_(0, inv, p)
    shift = torch.zeros(G, dtype=f64, device=dev).index_add_(0, inv, p * centered) / z  # b_g - mean_g R
    return centered, shift[inv], inv, count


def step_size_rule(*, ess_rule, ess_base_ratio, ess_weight_cap, ess_step, baseline):
    """The ``vcpo`` correction's ``step_size`` trait (:mod:`satrl.objectives.step_size`): the ESS rule, or None."""
    if not ess_step:
        return None

    def rule(inp: StepInputs) -> StepSize:
        return ess_step_scale(inp.d, inp.mask, ess_rule=ess_rule, ess_base_ratio=ess_base_ratio,
                              ess_weight_cap=ess_weight_cap)  # fmt: skip

    return rule


def opob_unweighted_advantages(rewards: Tensor, group_index: Tensor, log_w: Tensor, score_sq: Tensor,
                               std_norm: bool = True) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """:func:`opob_advantages` with every w_i = 1: b_g = sum_g ||grad log pi(tau_i)||^2 R_i / sum_g ||...||^2, the
    gradient-norm-weighted baseline without importance weights (``baseline=opob_unweighted``; ``log_w`` ignored)."""
    return opob_advantages(rewards, group_index, torch.zeros_like(log_w), score_sq, std_norm)


def baseline_rule(*, ess_rule, ess_base_ratio, ess_weight_cap, ess_step, baseline):
    """The ``vcpo`` correction's ``advantage`` trait: OPOB's advantages (weighted or not), or None (GRPO's)."""
    return {"opob": opob_advantages, "opob_unweighted": opob_unweighted_advantages}.get(baseline)


def vcpo_correction(inp: ObjectiveInputs, **params):
    """No per-token weight (1 everywhere): VCPO acts through the step size and the baseline
    (its traits, :func:`step_size_rule` and :func:`baseline_rule`)."""
    return None, None, {}
