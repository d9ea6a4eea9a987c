"""GRPO group advantages."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor,  # [B]
    group_index: torch.Tensor,  # [B] int, samples of one prompt share an index
    std_norm: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:  # [B]
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
