"""Sampling maths of the rollout engine: temperature, top-k/top-p truncation, inverse-CDF draws.

The behaviour policy mu of a step is ``softmax(truncate(logits / temperature))``: temperature first, then
top-k, then top-p on what top-k kept (the vLLM / HF order), renormalized over the kept support.
``behavior_logp`` is ``log mu(y)`` of the sampled token y under exactly that distribution.

Determinism independent of the batch: each request draws its own uniforms ``u [max_new_tokens]`` from a
``torch.Generator`` seeded with the request's seed, and step t picks the token where the CDF of mu first
reaches ``u_t`` (inverse-CDF: one uniform per token, whatever the vocabulary size or batch). The draw is
an exact sample of mu up to float32 rounding of the CDF.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from satrl.types import SamplingParams


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / top-p support to -inf. logits [B, V] float.

    top-k keeps the k largest logits (ties at the k-th value are kept too); top-p then keeps the smallest
    prefix of the sorted distribution whose mass reaches ``top_p`` (always at least the argmax; among
    equal logits the lower token id comes first).
    0 / 1.0 switch each off.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(
            logits, dim=-1, descending=True, stable=True
        )  # ties: lower id first
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # [B, V] mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampling_logprobs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """log mu over the vocabulary: log_softmax(truncate(logits / T)), float32 [B, V] (-inf off support)."""
    scaled = logits.float() / sampling.temperature
    return torch.log_softmax(truncate_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)


def request_uniforms(seeds: Sequence[int], n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-request uniforms in (0, 1], [B, n] float64: row b depends on ``seeds[b]`` only."""
    rows = [
        torch.rand(n, generator=torch.Generator().manual_seed(int(s)), dtype=torch.float64) for s in seeds
    ]
    return (1.0 - torch.stack(rows)).to(device)  # (0, 1]: u = 0 could land on a zero-mass leading token


def sample_step(
    logits: torch.Tensor, sampling: SamplingParams, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits [B, V] (any float dtype), u [B] in (0, 1].

    Returns ``(token [B] int64, behavior_logp [B] float32)``. Greedy takes the argmax of the truncated
    distribution and reports its temperature-scaled log-prob.
    """
    logp = sampling_logprobs(logits, sampling)  # [B, V]
    if sampling.greedy:
        token = logp.argmax(dim=-1)
    else:
        cdf = torch.cumsum(logp.exp(), dim=-1)  # [B, V]
        # scale u by the total mass so float32 rounding of the CDF can never push it past the end
        target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
        token = torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
    return token, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)
