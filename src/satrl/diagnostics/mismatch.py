"""Training-inference mismatch on sampled tokens: d̄_π, its split into policy lag and implementation
mismatch, and how much of the sampled total-variation mass the SAT gate catches.

Notation (docs/design.md glossary, paper Appendix A): ``logp`` = log π^(j)(y_t|s_t), the trainer's current
log-prob of the sampled token; ``behavior_logp`` = log μ(y_t|s_t), the engine's; ``logp_at_version`` =
log π^(ℓ)(y_t|s_t), the trainer's log-prob under the weights of the version ℓ that generated the sample;
``d = logp - behavior_logp`` (paper Eq. 26); ``mask`` marks active response tokens.

All functions are pure: tensors in, a dict of detached tensors out. Inactive positions may hold NaN/inf
and never affect any result. Scalars are 0-dim float64 tensors (float32 on MPS).
"""

from __future__ import annotations

import torch

from satrl.tensors import (
    as_bool_mask,
    check_same_shape,
    clean,
    clean_mean,
    quantile_sorted,
    wide_dtype,
)

__all__ = ["mismatch_stats", "decompose_mismatch", "gate_tv_share"]


def mismatch_stats(
    logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Summary of the sampled log-ratio d = log π − log μ over active tokens.

    Args:
        logp: [B, T] trainer log-prob of the sampled token.
        behavior_logp: [B, T] engine log-prob μ of the same token.
        mask: [B, T] bool (or 0/1), active response tokens.

    Returns 0-dim tensors:
        ``d_pi``: mean |d| (paper Eq. 52, d̄_π); ``d_mean``: mean d (signed drift);
        ``d_p90_abs``: 90th percentile of |d| (linear interpolation); ``d_max_abs``: max |d|;
        ``logratio_var``: population variance of d (divides by N, not N − 1).
        All are 0 when no token is active.
    """
    check_same_shape(mask, logp=logp, behavior_logp=behavior_logp)
    m = as_bool_mask(mask)
    dt = wide_dtype(logp.device)
    d = clean(logp, m, dt) - clean(behavior_logp, m, dt)  # [B, T], 0 on inactive
    abs_d = d.abs()
    d_mean = clean_mean(d, m)
    centered = torch.where(m, d - d_mean, torch.zeros((), dtype=dt, device=d.device))
    active_abs = torch.sort(abs_d[m]).values  # [N]
    zero = torch.zeros((), dtype=dt, device=d.device)
    return {
        "d_pi": clean_mean(abs_d, m),
        "d_mean": d_mean,
        "d_p90_abs": quantile_sorted(active_abs, 0.9),
        "d_max_abs": active_abs[-1] if active_abs.numel() else zero,
        "logratio_var": clean_mean(centered.square(), m),
    }


def decompose_mismatch(
    logp: torch.Tensor,
    logp_at_version: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Split d = log π^(j) − log μ into policy lag and implementation mismatch (paper Eq. 2 / Eq. 26):

        Δπ    = log π^(j) − log π^(ℓ)      (the weights moved since the sample was generated)
        Δimpl = log π^(ℓ) − log μ          (same weights, different numerics / kernels / routing)
        d     = Δπ + Δimpl

    Args:
        logp: [B, T] log π^(j), current trainer weights.
        logp_at_version: [B, T] log π^(ℓ), trainer forward pass with the weights of the sample's version.
        behavior_logp: [B, T] log μ from the engine.
        mask: [B, T] active tokens.

    Returns:
        ``tok/delta_pi``, ``tok/delta_impl``, ``tok/d``: [B, T] per-token terms, 0 on inactive positions;
        ``d_policy`` = mean |Δπ|, ``d_impl`` = mean |Δimpl| over active tokens;
        ``frac_policy`` = Σ|Δπ| / (Σ|Δπ| + Σ|Δimpl|) and ``frac_impl`` = 1 − frac_policy, the share of the
        absolute mismatch attributed to each source (both 0 when there is no mismatch at all). The two
        terms can cancel, so |d| ≤ |Δπ| + |Δimpl| and these shares are of the sum, not of |d|.

    Exactness: the three differences are taken in float64. For float32 (or bf16/fp16) inputs whose
    nonzero magnitudes lie in [2**-24, 32) -- sampled-token log-probs above -32, i.e. every token with
    probability above 1.3e-14 -- each difference of two inputs needs at most 53 significant bits, so it is
    exact in float64, and then Δπ + Δimpl == d holds bitwise. Outside that range (or for float64 inputs)
    each of the 4 roundings errs by at most 2**-53 times a value below 2·M, M = max|log-prob|, so
    |Δπ + Δimpl − d| ≤ 2**-50·M, at least 2**26 times finer than the float32 spacing of the inputs. ``tests/diagnostics/test_mismatch.py`` checks both statements.
    """
    check_same_shape(mask, logp=logp, logp_at_version=logp_at_version, behavior_logp=behavior_logp)
    m = as_bool_mask(mask)
    dt = wide_dtype(logp.device)
    a = clean(logp, m, dt)
    b = clean(logp_at_version, m, dt)
    c = clean(behavior_logp, m, dt)
    delta_pi = a - b  # [B, T]
    delta_impl = b - c  # [B, T]
    d = a - c  # [B, T]
    sum_pi = delta_pi.abs().sum()
    sum_impl = delta_impl.abs().sum()
    total = sum_pi + sum_impl
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    frac_policy = torch.where(total > 0, sum_pi / safe_total, torch.zeros_like(total))
    frac_impl = torch.where(total > 0, sum_impl / safe_total, torch.zeros_like(total))
    return {
        "tok/delta_pi": delta_pi,
        "tok/delta_impl": delta_impl,
        "tok/d": d,
        "d_policy": clean_mean(delta_pi.abs(), m),
        "d_impl": clean_mean(delta_impl.abs(), m),
        "frac_policy": frac_policy,
        "frac_impl": frac_impl,
    }


def gate_tv_share(
    logp: torch.Tensor, behavior_logp: torch.Tensor, gate: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Does the SAT gate pick the tokens that carry the mismatch?

    Per active sampled token the TV mass is m_t = ½ |π(y_t|s_t) − μ(y_t|s_t)| (the sampled-token term
    of the per-state D_TV; a diagnostic on sampled tokens only, like the paper's Table 10).

    Args:
        logp, behavior_logp: [B, T] log π and log μ of the sampled token.
        gate: [B, T] bool, tokens the SAT gate contracts (``tok/gate`` from the objective).
        mask: [B, T] active tokens; gated-but-inactive tokens are ignored.

    Returns 0-dim tensors:
        ``tv_share`` = Σ_{gated, active} m / Σ_{active} m  (0 when the denominator is 0);
        ``gate_rate`` = gated active tokens / active tokens (0 when nothing is active);
        ``tv_lift`` = tv_share / gate_rate: TV mass per gated token relative to the average token;
            1.0 = the gate does no better than chance, 1/gate_rate = all mass on gated tokens.
            NaN when undefined (no gated token, or no TV mass at all); never inf.
        ``tv_mass_mean`` = mean m over active tokens.
    """
    check_same_shape(mask, logp=logp, behavior_logp=behavior_logp, gate=gate)
    m = as_bool_mask(mask)
    dt = wide_dtype(logp.device)
    tv = 0.5 * (clean(logp, m, dt).exp() - clean(behavior_logp, m, dt).exp()).abs()  # [B, T]
    tv = torch.where(m, tv, torch.zeros((), dtype=dt, device=tv.device))
    g = as_bool_mask(gate.detach()) & m
    total = tv.sum()
    gated = torch.where(g, tv, torch.zeros_like(tv)).sum()
    one = torch.ones_like(total)
    tv_share = torch.where(total > 0, gated / torch.where(total > 0, total, one), torch.zeros_like(total))
    n_active = m.sum().to(dt)
    gate_rate = g.sum().to(dt) / n_active.clamp(min=1)
    defined = (gate_rate > 0) & (total > 0)
    tv_lift = torch.where(
        defined, tv_share / torch.where(defined, gate_rate, one), torch.full_like(total, float("nan"))
    )
    return {
        "tv_share": tv_share,
        "gate_rate": gate_rate,
        "tv_lift": tv_lift,
        "tv_mass_mean": clean_mean(tv, m),
    }
