"""Staleness statistics: how old the consumed tokens are, and per-lag breakdowns of any per-token
quantity (clip fraction, gate rate, |d| ...). No peer framework logs the latter; it shows whether the
trust region actually bites harder on staler tokens.

``lag`` = trainer version − sample version, per token ([B, T]) or per sequence ([B], broadcast over T).
"""

from __future__ import annotations

import torch

from satrl.tensors import as_bool_mask, wide_dtype

__all__ = ["by_lag", "lag_stats", "multi_version"]


def _lag_2d(lag: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence lag [B] to [B, T]; check a per-token lag matches the mask."""
    if lag.dim() == 1 and mask.dim() == 2 and lag.shape[0] == mask.shape[0]:
        return lag[:, None].expand_as(mask)
    if lag.shape != mask.shape:
        raise ValueError(
            f"lag has shape {tuple(lag.shape)} but mask has shape {tuple(mask.shape)}; "
            f"pass lag per token [B, T] or per sequence [B]"
        )
    return lag


def lag_stats(lag: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean, min and max lag over active tokens (mean token-weighted). All 0 when nothing is active.

    Args:
        lag: [B, T] or [B] int, trainer version − sample version.
        mask: [B, T] active tokens.
    Returns: ``mean``, ``min``, ``max`` (0-dim floats).
    """
    m = as_bool_mask(mask)
    lag2 = _lag_2d(lag.detach(), m)
    dt = wide_dtype(lag.device)
    lf = torch.where(m, lag2.to(dt), torch.zeros((), dtype=dt, device=lag.device))
    n = m.sum()
    neg_inf = torch.full((), float("-inf"), dtype=dt, device=lag.device)
    mx = torch.where(m, lf, neg_inf).max() if lf.numel() else neg_inf
    mn = torch.where(m, lf, -neg_inf).min() if lf.numel() else -neg_inf
    return {
        "mean": lf.sum() / n.clamp(min=1).to(dt),
        "min": torch.where(n > 0, mn, torch.zeros_like(mn)),
        "max": torch.where(n > 0, mx, torch.zeros_like(mx)),
    }


def by_lag(lag: torch.Tensor, mask: torch.Tensor, **per_token: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean of each per-token quantity over the active tokens of each distinct lag.

    Args:
        lag: [B, T] or [B] int lag.
        mask: [B, T] active tokens.
        **per_token: name -> [B, T] tensor (bool is read as 0/1), e.g.
            ``clipfrac=tok_clipped, gate_rate=tok_gate, abs_d=tok_d.abs()``.

    Returns: ``{f"{k}/{name}": 0-dim tensor}`` for every lag value k present among active tokens
    (the trainer prefixes ``bylag/``). Also ``f"{k}/frac_tokens"``: the share of active tokens at lag k,
    so a reader can tell a bucket of 3 tokens from one of 3000.
    """
    m = as_bool_mask(mask)
    lag2 = _lag_2d(lag.detach(), m)
    dt = wide_dtype(lag.device)
    for name, x in per_token.items():
        if x.shape != m.shape:
            raise ValueError(
                f"per-token quantity {name!r} has shape {tuple(x.shape)}, expected {tuple(m.shape)}"
            )
    lags = torch.unique(lag2[m]).tolist()  # sorted ascending
    n_active = m.sum().to(dt)
    zero = torch.zeros((), dtype=dt, device=lag.device)
    clean = {name: torch.where(m, x.detach().to(dt), zero) for name, x in per_token.items()}
    out: dict[str, torch.Tensor] = {}
    for k in lags:
        sel = m & (lag2 == k)  # [B, T]
        n_k = sel.sum().to(dt)
        out[f"{k}/frac_tokens"] = n_k / n_active
        for name, x in clean.items():
            out[f"{k}/{name}"] = torch.where(sel, x, zero).sum() / n_k
    return out


def multi_version(versions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] bool: whether a row's active tokens were sampled by more than one policy version (in-flight weight
    updates switched weights mid-response, ``lag.inflight_every``).

    Args:
        versions: [B, T] int policy version per token.
        mask: [B, T] active tokens.
    """
    m = as_bool_mask(mask)
    newest = torch.where(m, versions, torch.iinfo(versions.dtype).min).max(1).values
    oldest = torch.where(m, versions, torch.iinfo(versions.dtype).max).min(1).values
    return m.any(1) & (newest > oldest)
