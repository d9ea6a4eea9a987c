"""Helpers of the engine tests: tiny dense and MoE causal LMs built straight from transformers configs,
a reference teacher-forced forward (what the trainer computes), and chi-square statistics.
(A uniquely named module: several test folders have a conftest.py.)"""

from __future__ import annotations

import math

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from satrl.types import Completion, GenerationRequest

VOCAB = 40
PAD, EOS = 0, 1
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=48,
    tie_word_embeddings=True,
    initializer_range=0.1,  # larger than the default 0.02, so next-token distributions are far from uniform
)


def tiny_model(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "dense":
        model = Qwen3ForCausalLM(Qwen3Config(intermediate_size=128, **COMMON))
    else:
        cfg = Qwen3MoeConfig(
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            **COMMON,
        )
        model = Qwen3MoeForCausalLM(cfg)
    return model.float().eval()


def make_requests(n: int, seed: int = 1, min_len: int = 1, max_len: int = 8, base_seed: int = 100):
    """n requests with prompt lengths in [min_len, max_len], tokens never PAD/EOS, seeds base_seed+i."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(2, VOCAB, (length,), generator=g).tolist()
        out.append(GenerationRequest(f"r{i}", ids, seed=base_seed + i))
    return out


def teacher_forced(model, completions: list[Completion], routing: torch.Tensor | None = None):
    """Trainer-style forward: right-padded [prompt + response] rows, fp32, no cache. Returns the logits
    [B, T, V] at the positions that predict each response token and the row layout (prompt_len, T)."""
    P = [len(c.prompt_ids) for c in completions]
    L = max(p + len(c.response_ids) for p, c in zip(P, completions))
    ids = torch.full((len(completions), L), PAD, dtype=torch.int64)
    attn = torch.zeros((len(completions), L), dtype=torch.int64)
    for b, c in enumerate(completions):
        row = c.prompt_ids + c.response_ids
        ids[b, : len(row)], attn[b, : len(row)] = torch.tensor(row), 1
    from contextlib import nullcontext

    from satrl.models.routing import replay_routing

    with torch.no_grad(), replay_routing(model, routing) if routing is not None else nullcontext():
        logits = model(input_ids=ids, attention_mask=attn).logits.double()
    T = max(len(c.response_ids) for c in completions)
    out = torch.zeros((len(completions), T, logits.shape[-1]), dtype=torch.float64)
    for b, c in enumerate(completions):
        out[b, : len(c.response_ids)] = logits[b, P[b] - 1 : P[b] - 1 + len(c.response_ids)]
    return out


def ref_logprobs(z: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Naive float64 reference of the sampling distribution for one row of logits z [V]: temperature,
    then keep the top-k values (ties kept), then keep tokens in descending order while the mass before
    them (renormalized over the top-k set) is < top_p, lower id first among ties. Returns log mu [V],
    -inf off the support. z / T is rounded to float32 like the engine's, so ties stay ties."""
    z = (z.float() / temperature).tolist()
    V = len(z)
    keep = set(range(V))
    if 0 < top_k < V:
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = {i for i in range(V) if z[i] >= kth}
    if top_p < 1.0:
        lse = math.log(sum(math.exp(z[i]) for i in keep))
        mass, kept = 0.0, set()
        for i in sorted(keep, key=lambda i: (-z[i], i)):
            if mass >= top_p and kept:
                break
            kept.add(i)
            mass += math.exp(z[i] - lse)
        keep = kept
    lse = math.log(sum(math.exp(z[i]) for i in keep))
    return torch.tensor([z[i] - lse if i in keep else float("-inf") for i in range(V)], dtype=torch.float64)


def sampled_ref_logp(model, completions, temperature, top_k=0, top_p=1.0, routing=None) -> torch.Tensor:
    """Reference log mu of every sampled token, concatenated over completions [sum T] float64."""
    logits = teacher_forced(model, completions, routing)
    out = []
    for b, c in enumerate(completions):
        for t, y in enumerate(c.response_ids):
            out.append(ref_logprobs(logits[b, t], temperature, top_k, top_p)[y])
    return torch.stack(out)


def chi2_critical(dof: int, z: float = 3.090232) -> float:
    """Upper critical value of chi-square(dof), Wilson-Hilferty approximation (z = standard normal
    quantile; 3.090232 gives alpha = 0.001). Within 1% of the tables for dof >= 7, 2.5% below."""
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson statistic sum (O - E)^2 / E with bins of E < min_expected merged into one; returns
    (statistic, dof = bins - 1)."""
    n = float(counts.sum())
    expected = probs.double() * n
    small = expected < min_expected
    obs, exp = counts[~small].double(), expected[~small]
    if small.any():
        obs = torch.cat([obs, counts[small].double().sum().view(1)])
        exp = torch.cat([exp, expected[small].sum().view(1)])
    return float(((obs - exp) ** 2 / exp).sum()), int(obs.numel()) - 1
