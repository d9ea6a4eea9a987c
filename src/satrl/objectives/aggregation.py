"""Aggregation of per-token losses into one scalar: verl's four ``loss_agg_mode`` values.

With l_bt the per-token loss, m_bt the mask, L_b = sum_t m_bt the response length, and B' the number of
non-empty responses:
- ``token-mean``:              sum_bt m l / sum_bt m                 (every token weighs the same)
- ``seq-mean-token-mean``:     (1/B') sum_b (sum_t m l / L_b)        (every response weighs the same; GSPO)
- ``seq-mean-token-sum``:      (1/B') sum_b sum_t m l
- ``seq-mean-token-sum-norm``: (1/B') sum_b sum_t m l / H            (Dr. GRPO; H = ``horizon``, default T)

Departure: verl divides the ``seq-mean-token-sum-norm`` total by H only; we also average over responses
so that the scale does not grow with the number of responses in a microbatch. Empty batches give 0.
Masked positions may hold any value (NaN included): selection is by ``where``. The registry naming the modes,
and :func:`~satrl.objectives.components.aggregate`, which reduces by a mode's name, are
:mod:`satrl.objectives.components`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from satrl.tensors import lengths, masked


def _n_seq(mask: Tensor) -> Tensor:
    return torch.count_nonzero(mask.any(-1)).clamp(min=1).to(torch.float32)


def token_mean(loss_tok: Tensor, mask: Tensor, horizon: int | None) -> Tensor:
    return masked(loss_tok, mask).sum() / torch.count_nonzero(mask).clamp(min=1)


def seq_mean_token_mean(loss_tok: Tensor, mask: Tensor, horizon: int | None) -> Tensor:
    per_seq = masked(loss_tok, mask).sum(-1) / lengths(mask).clamp(min=1)
    return per_seq.sum() / _n_seq(mask)


def seq_mean_token_sum(loss_tok: Tensor, mask: Tensor, horizon: int | None) -> Tensor:
    return masked(loss_tok, mask).sum() / _n_seq(mask)


def seq_mean_token_sum_norm(loss_tok: Tensor, mask: Tensor, horizon: int | None) -> Tensor:
    h = mask.shape[-1] if horizon is None else horizon
    return masked(loss_tok, mask).sum() / (_n_seq(mask) * h)
