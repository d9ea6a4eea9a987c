"""MoE routing disagreement between the rollout engine and the trainer (paper Appendix C: the Top-K
mask is discontinuous in the router logits, so tiny numeric differences can switch experts).
With R3 (routing replay) the trainer reuses the engine's experts and the disagreement is exactly 0.
"""

from __future__ import annotations

import torch

from satrl.tensors import as_bool_mask, wide_dtype

__all__ = ["routing_disagreement"]


def routing_disagreement(
    engine_routing: torch.Tensor, trainer_routing: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Share of active (token, layer) pairs whose top-k expert SETS differ (order is ignored).

    Args:
        engine_routing: [B, T, layers, top_k] int, experts the engine used per generated token.
        trainer_routing: [B, T, layers, top_k] int, experts the trainer's own router picks.
        mask: [B, T] active tokens; routing at inactive positions may hold anything (e.g. -1).

    Returns 0-dim tensors:
        ``route_disagree``: over all active (token, layer) pairs;
        ``route_disagree/layer{i}``: per MoE layer, over active tokens;
        ``expert_diff``: mean share of the k experts not shared between the two sets (finer than
            ``route_disagree``: one swapped expert out of k=2 counts 0.5).
        All 0 when nothing is active.
    """
    if engine_routing.shape != trainer_routing.shape or engine_routing.dim() != 4:
        raise ValueError(
            f"engine_routing {tuple(engine_routing.shape)} and trainer_routing {tuple(trainer_routing.shape)} "
            f"must both be [B, T, layers, top_k]"
        )
    m = as_bool_mask(mask)
    if m.shape != engine_routing.shape[:2]:
        raise ValueError(f"mask {tuple(m.shape)} must be [B, T] = {tuple(engine_routing.shape[:2])}")
    e = torch.sort(engine_routing.detach(), dim=-1).values
    t = torch.sort(trainer_routing.detach(), dim=-1).values
    dt = wide_dtype(engine_routing.device)
    differ = (e != t).any(dim=-1)  # [B, T, layers]; sorted sets of distinct ids are equal iff equal
    shared = (e[..., :, None] == t[..., None, :]).any(dim=-1).sum(dim=-1)  # [B, T, layers]
    k = e.shape[-1]
    m3 = m[..., None].expand_as(differ)  # [B, T, layers]
    zero = torch.zeros((), dtype=dt, device=e.device)
    differ_f = torch.where(m3, differ.to(dt), zero)
    diff_share = torch.where(m3, (k - shared).to(dt) / max(k, 1), zero)
    n_tok = m.sum().to(dt).clamp(min=1)
    per_layer = differ_f.sum(dim=(0, 1)) / n_tok  # [layers]
    n_pairs = n_tok * differ.shape[-1] if differ.shape[-1] else torch.ones_like(n_tok)
    out = {
        "route_disagree": differ_f.sum() / n_pairs,
        "expert_diff": diff_share.sum() / n_pairs,
    }
    for i, v in enumerate(per_layer):
        out[f"route_disagree/layer{i}"] = v
    return out
