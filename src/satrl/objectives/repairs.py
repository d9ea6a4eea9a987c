"""Staleness repairs other frameworks ship: decoupled PPO, A-3PO, TOPR, VESPO and M2PO's official clip.

Each is a trust region or a correction (signatures as in :mod:`.trust_regions` and :mod:`.corrections`),
composed by presets in :mod:`.presets`; verl's rejection masks are in :mod:`.rejection`. Shapes: every
tensor is [B, T] (``adv`` [B, 1] or [B, T]); ``r`` is the ratio level's ratio, ``d`` its detached log,
mu the behaviour (engine) policy, pi_prox the trainer's own policy at the start of the rollout batch (the
trainer's ``old_logp``), ``lag`` = trainer version - the version that sampled the token. Losses are minimized.

- correction ``decoupled`` (decoupled PPO: AReaL, Fu et al. 2025, arXiv 2505.24298; AReaL
  ``areal/utils/functional/functional.py::ppo_actor_loss_fn``): the behaviour weight on PPO's loss,
  with k = pi_prox / mu and C = ``behav_imp_weight_cap`` (5, AReaL's example configs)::

      w = k 1{k <= C}   (mode "mask": AReaL's default, tokens above the cap are dropped)
      w = min(k, C)     (mode "truncate")
      loss = -S_PPO(pi / pi_prox) w

  With ``old_logp`` (the trainer passes it, the correction declares it) the ratio's denominator is pi_prox.
  **With one optimizer step per rollout batch** (``train.minibatches=1, ppo_epochs=1``) pi_theta == pi_prox
  at the step: r == 1, the clip never bites, and the objective reduces to the behaviour-weighted policy
  gradient ``-w A grad log pi``, i.e. k 1{k <= C} A grad log pi (mask) or min(k, C) A grad log pi
  (truncate): exactly ``grpo_mis`` with ``mis_threshold=C`` (``grpo_tis`` with ``tis_cap=C``).
- trust region ``a3po`` (A-3PO: Wu, Li and Shen 2025, arXiv 2512.06547; AReaL
  ``areal/trainer/ppo/actor.py::compute_prox_logp_approximations``, method "loglinear"): decoupled PPO
  with pi_prox approximated from the token's version instead of a forward pass::

      alpha = clip((v_prox - v_mu) / (v_theta - v_mu), 0, 1)   (0 where v_theta == v_mu)
      log pi_prox = sg[lerp(log mu, log pi, alpha)] = sg[log mu + alpha (log pi - log mu)]
      loss = -S_PPO(pi / pi_prox) w(pi_prox / mu)               (w as ``decoupled``)

  AReaL's v_theta is the trainer's version when the batch's update starts and v_mu the token's version, so
  v_theta - v_mu is satrl's ``lag``; AReaL sets v_prox = v_theta - 1 ("the last broadcast"), so
  alpha = (lag - 1) / lag. ``prox_lag`` = v_theta - v_prox (1: AReaL's code). **In satrl's one-step-per-batch
  regime** the exact proximal policy is pi_theta itself (v_prox = v_theta, alpha = 1: ``prox_lag=0`` makes
  a3po ``decoupled_ppo``), but AReaL's alpha = (lag - 1) / lag gives: at lag 1, alpha = 0, pi_prox = mu,
  w = 1, so a3po *is* GRPO (PPO's clip on pi / mu); at lag L, the clip acts on r = (pi / mu)^(1/L) and
  w = (pi / mu)^((L-1)/L). Inside the clip r w = pi / mu, so the gradient is the full IS gradient
  (pi / mu) A grad log pi, with tokens dropped where w > C. As in AReaL, pi_prox is built from the detached
  log pi (no gradient through it); alpha is computed in the log-probs' dtype (AReaL: float32), and lerp gives
  log mu and log pi exactly at alpha 0 and 1. ``clipfrac`` counts the clip's and the cap's dropped tokens.
- trust region ``topr`` (TOPR: Le Roux et al. 2025, arXiv 2503.14286, Eq. 8; ROLL
  ``roll/pipeline/agentic/agentic_actor_pg_worker.py::_compute_topr_loss``): REINFORCE, positives without
  importance sampling, negatives weighted by the truncated ratio::

      loss = -c+ A log pi                    (A > 0)
      loss = -c- sg[clip(r, 0, 1)] A log pi  (A <= 0)

  c+ / c- = ``topr_positive_weight`` / ``topr_negative_weight`` (1, ROLL's defaults). ROLL's ratio is per
  token (``ratio_type`` "segment" is the geometric mean over the response: ``ratio="sequence"`` here); the
  paper's is the trajectory's product. ROLL splits by the episode's score (> 0 positive), we by the sign of A
  (the same for GRPO with 0/1 rewards; A = 0 contributes nothing either way).
- trust region ``vespo`` (VESPO: arXiv 2602.10693; ``FloyedShen/VESPO``
  ``recipe/vespo/code/core_algos.py::compute_policy_loss_vespo``): REINFORCE weighted by a detached kernel
  of the response's importance weight, the true product (not length-normalized)::

      log w_b = clip(sum_t clip(log pi_bt - log mu_bt, +-20), +-20)
      phi(w) = e^lambda w^k e^(-lambda w)   (phi(1) = 1: normalized by e^lambda)
      loss_bt = -sg[phi(w_b)] A_bt log pi_bt

  (k, lambda) = (``k_pos``, ``lambda_pos``) where the response's advantage is >= 0, else (``k_neg``,
  ``lambda_neg``): (2, 3) and (3, 2), the defaults of VESPO's code and run scripts (its docstring's
  2/1.5/4/2.5 are stale). w is taken against mu directly: VESPO's pi / pi_old times its rollout IS weight
  pi_old / mu, folded in without truncation, whatever the ratio's denominator; log w is clamped at
  log 1e-8 inside phi, as VESPO does.
- trust region ``m2po_official`` (``Infini-AI-Lab/M2PO`` ``verl/trainer/ppo/core_algos.py::
  compute_m2po_policy_loss``): PPO's clip with one adaptive interval per call instead of the paper's mask
  (``m2po``, Algorithm 1). Over the "harmful" tokens H (A > 0 and r > 1, or A < 0 and r < 1) with
  v = d^2 sorted ascending and n = |H|: if mean(v) <= B (``m2_budget``, 0.04) nothing is clipped
  (interval [0, 1e5]); else, with the first k such that v_k (n - k - 1) + sum_{i<=k} v_i >= B n,
  tau = sqrt(v_{k-1}) (0 if k = 0), a breakpoint at which capping every |d| at tau leaves the mean of
  min(v, tau^2) just under B, and::

      eps_low = max(1 - e^-tau, miniclip_low),   eps_high = max(e^tau - 1, miniclip_high)
      loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)

  The floors 0.3 / 0.5 (the function's defaults) make the interval never tighter than [0.7, 1.5]. The
  repo's ``dp_actor.py`` passes ``config.get("miniclip_low", None)`` and its scripts set none, so its own
  runs had no floor (``miniclip_low=None, miniclip_high=None`` here). Like ``m2po``, it is computed over
  what the caller passes (one microbatch in the trainer), as the repo's per-microbatch loss does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import count, masked, masked_frac, masked_max, masked_mean, seq_mean

from ._common import LOG_RATIO_CLAMP
from .corrections import mismatch_weight
from .trust_regions import ObjectiveInputs, Region, clip

# --------------------------------------------------------------------------------- decoupled PPO


@torch.no_grad()
def behaviour_weight(k: Tensor, mask: Tensor, cap: float, mode: str) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(weight, over, metrics) for the behaviour weight ``k`` [B, T]: the weight is k where k <= cap and 0
    (mask) or cap (truncate) above, 1 on masked positions; ``over`` marks active tokens with k > cap."""
    over = (k > cap) & mask
    w = torch.where(over, 0.0 if mode == "mask" else cap, k).to(k.dtype)
    n = count(mask)
    metrics = {
        "behav_imp_mean": masked_mean(w, mask, n),
        "behav_imp_max": masked_max(k, mask).to(torch.float32),
        "behav_imp_capfrac": masked_frac(over, mask, n),
    }
    return masked(w, mask, 1.0), over, metrics


@torch.no_grad()
def decoupled_correction(inp: ObjectiveInputs, *, behav_imp_weight_cap, behav_imp_weight_mode, correction_level):
    """Decoupled PPO's behaviour weight: k 1{k <= C} (mask) or min(k, C) (truncate), k = pi_prox / mu."""
    k = mismatch_weight(inp, correction_level)
    w, over, metrics = behaviour_weight(k, inp.mask, behav_imp_weight_cap, behav_imp_weight_mode)
    return w, (over if behav_imp_weight_mode == "mask" else None), metrics


# ------------------------------------------------------------------------------------------ A-3PO


@torch.no_grad()
def a3po_alpha(lag: Tensor, mask: Tensor, prox_lag: int, dtype: torch.dtype) -> Tensor:
    """alpha = clip((lag - prox_lag) / lag, 0, 1) where lag > 0, else 0 (AReaL's guard); 0 when masked."""
    lag = torch.where(mask, lag.to(dtype), 0.0)
    return torch.where(lag > 0, ((lag - prox_lag) / lag.clamp(min=1)).clamp(0.0, 1.0), 0.0).to(dtype)


def a3po_trust_region(
    ratio, d, adv, mask, inp, *, eps_low, eps_high, dual_clip, behav_imp_weight_cap, behav_imp_weight_mode, prox_lag
) -> Region:
    """A-3PO: PPO clip on pi / sg[pi_prox] times the behaviour weight w(pi_prox / mu), with log pi_prox =
    lerp(log mu, log pi, alpha) from the token's lag. Computes its own ratio (use ``ratio="token"``)."""
    if inp.lag is None:
        raise ValueError("the a3po trust region needs lag= (the per-token lag, trainer version - sample version)")
    lp = masked(inp.logp, mask)
    with torch.no_grad():
        lmu = masked(inp.behavior_logp, mask)
        alpha = a3po_alpha(inp.lag, mask, prox_lag, lp.dtype)
        log_prox = torch.lerp(lmu, lp.detach(), alpha)  # exactly log mu at alpha 0, log pi at alpha 1
    r = torch.exp((lp - log_prox).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    region = clip(r, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip, inp.n)
    k = (log_prox - lmu).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    w, over, metrics = behaviour_weight(k, mask, behav_imp_weight_cap, behav_imp_weight_mode)
    metrics.update(region.metrics)
    metrics["a3po_alpha_mean"] = masked_mean(alpha, mask, inp.n)
    clipped = region.clipped | over if behav_imp_weight_mode == "mask" else region.clipped
    return Region(region.loss * w, clipped, metrics)


# ------------------------------------------------------------------------------------------- TOPR


def topr_trust_region(ratio, d, adv, mask, inp, *, topr_positive_weight, topr_negative_weight) -> Region:
    """TOPR: -c+ A log pi where A > 0, -c- sg[clip(r, 0, 1)] A log pi elsewhere; no token loses its gradient."""
    with torch.no_grad():
        r = ratio.detach()
        neg = adv <= 0
        w = torch.where(neg, topr_negative_weight * r.clamp(0.0, 1.0), topr_positive_weight)
        n = count(mask)
        metrics = {
            "topr_neg_capfrac": masked_frac((adv < 0) & (r > 1.0), mask, n),  # A < 0, weight held at 1
            "topr_neg_weight_mean": masked_mean(w, mask & (adv < 0)),  # mean weight of the A < 0 tokens
        }
    loss = -w * adv * masked(inp.logp, mask)
    return Region(loss, torch.zeros_like(mask), metrics)


# ------------------------------------------------------------------------------------------ VESPO


@torch.no_grad()
def vespo_phi(log_w: Tensor, pos: Tensor, k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float) -> Tensor:
    """phi(w) = exp(lambda + k log max(w, 1e-8) - lambda w) per response, (k, lambda) by ``pos``.  # [B] -> [B]"""
    k = torch.where(pos, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(pos, lambda_pos, lambda_neg).to(log_w.dtype)
    w = log_w.exp()
    phi = torch.exp(lam + k * w.clamp(min=1e-8).log() - lam * w)
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def vespo_trust_region(ratio, d, adv, mask, inp, *, k_pos, lambda_pos, k_neg, lambda_neg) -> Region:
    """VESPO: -sg[phi(w_b)] A log pi with w_b = prod_t pi / mu over the response (computed here from
    ``logp`` and ``behavior_logp``; the ratio level is not used)."""
    with torch.no_grad():
        tok = masked(inp.logp.detach() - inp.behavior_logp, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_w = tok.sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B]
        abar = adv[:, 0] if adv.shape[-1] == 1 else seq_mean(adv, mask)  # the response's advantage
        phi = vespo_phi(log_w, abar >= 0, k_pos, lambda_pos, k_neg, lambda_neg)[:, None]  # [B, 1]
        n = count(mask)
        metrics = {
            "vespo_phi_mean": masked_mean(phi.expand_as(tok), mask, n),
            "vespo_log_w_mean": masked_mean(log_w[:, None].expand_as(tok), mask, n),
        }
    loss = -phi * adv * masked(inp.logp, mask)
    return Region(loss, torch.zeros_like(mask), metrics)


# ---------------------------------------------------------------------------------- M2PO, official


@torch.no_grad()
def m2po_official_bounds(
    d: Tensor, adv: Tensor, mask: Tensor, budget: float, miniclip_low: float | None, miniclip_high: float | None
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(lo, hi, metrics): the official repo's interval for one call, 0-dim tensors; see the module docstring.

    The repo's loop over breakpoints is vectorized: non-harmful tokens sort last (+inf), the condition is
    evaluated at every rank and the first rank that meets it is read on the device (no host sync)."""
    r = d.exp()
    harm = mask & (((adv > 1e-12) & (r > 1 + 1e-12)) | ((adv < -1e-12) & (r < 1 - 1e-12)))
    v = d.square()
    n = torch.count_nonzero(harm).to(torch.float64)
    total = torch.where(harm, v, 0.0).sum(dtype=torch.float64)
    m2 = total / n.clamp(min=1)
    if v.numel() == 0:
        tau, m2_after, need = m2, m2, torch.zeros((), dtype=torch.bool)
    else:
        vs = torch.sort(torch.where(harm, v, float("inf")).reshape(-1)).values
        csum = torch.where(torch.isfinite(vs), vs, 0.0).cumsum(0).double()  # prefix sums in d's dtype, as the repo
        vs = vs.double()
        rank = torch.arange(vs.numel(), device=d.device, dtype=torch.float64)
        rest = n - rank - 1
        cond = ((vs - 1e-12) * rest + csum >= budget * n - 1e-12) & (rank < n)
        first = torch.argmax(cond.to(torch.uint8)).reshape(1)  # the first rank that meets it
        prev = (first - 1).clamp(min=0)
        v_prev, c_prev = vs.index_select(0, prev)[0], csum.index_select(0, prev)[0]
        tau = torch.where(first[0] > 0, (v_prev - 1e-12).clamp(min=0.0).sqrt(), 0.0)
        m2_after = torch.where(first[0] > 0, (v_prev * (n - first[0]) + c_prev) / n.clamp(min=1), m2)
        need = (n > 0) & (m2 > budget + 1e-12)
    # e^-tau, e^tau in float32, as the repo computes them (torch.tensor of a float); no clip: its [0, 1e5]
    eps_low = torch.where(need, 1.0 - torch.exp(-tau.float()).double(), 1.0)
    eps_high = torch.where(need, torch.exp(tau.float()).double() - 1.0, 1e5 - 1.0)
    if miniclip_low is not None:
        eps_low = eps_low.clamp(min=miniclip_low)
    if miniclip_high is not None:
        eps_high = eps_high.clamp(min=miniclip_high)
    lo, hi = (1.0 - eps_low).to(d.dtype), (1.0 + eps_high).to(d.dtype)
    metrics = {"m2po_lo": lo.float(), "m2po_hi": hi.float(), "m2po_m2": m2.float(),
               "m2po_m2_after": torch.where(need, m2_after, m2).float()}  # fmt: skip
    return lo, hi, metrics


def m2po_official_trust_region(ratio, d, adv, mask, inp, *, m2_budget, miniclip_low, miniclip_high) -> Region:
    """The official M2PO repo's loss: PPO's clip with the call's adaptive interval :func:`m2po_official_bounds`."""
    lo, hi, metrics = m2po_official_bounds(d, adv, mask, m2_budget, miniclip_low, miniclip_high)
    region = clip(ratio, adv, mask, lo, hi, None, inp.n)
    return Region(region.loss, region.clipped, {**region.metrics, **metrics})
