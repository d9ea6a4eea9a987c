"""A small, self-contained sampler for scoring a policy during pretraining (calibration).

This is deliberately *not* the rollout engine (``satrl.engines``): no KV cache, no behaviour log-probs,
no routing. It re-runs the full sequence each step, which is cheap for the ~15-token arithmetic
sequences, and it keeps ``satrl.models`` free of imports from higher layers. Sampling is temperature
softmax over the full vocabulary (no top-p / top-k), as the paper's Appendix F asks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@torch.no_grad()
def sample_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> list[str]:
    """One completion per prompt (repeat prompts for k samples). Stops at EOS or ``max_new_tokens``;
    the returned text excludes EOS and special tokens. Deterministic for ``seed`` and the prompt list."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [B, P] left-padded
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        attn[i, width - len(r) :] = 1
    gen = torch.Generator().manual_seed(seed)
    done = torch.zeros(len(rows), dtype=torch.bool)
    out: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L] positions ignore left padding
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1].float()  # [B, V]
        if greedy:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)  # [B]
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        out.append(nxt)
        done |= nxt == eos
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        attn = torch.cat([attn, (~done | (nxt == eos)).long()[:, None]], dim=1)
        if done.all():
            break
    resp = torch.stack(out, dim=1).tolist()  # [B, T]
    texts = []
    for r in resp:
        r = r[: r.index(eos)] if eos in r else r
        texts.append(tokenizer.decode(r, skip_special_tokens=True))
    return texts


def score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Any],
    reward: Callable[[Any, str], float],
    *,
    k: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 0,
    batch: int = 512,
) -> dict[str, float]:
    """``avg_at_k`` (mean over problems and k samples of the 0/1 reward, the paper's avg@k) and
    ``greedy_acc`` for ``problems`` (objects with ``prompt``; ``reward(problem, text)`` scores one)."""
    was_training = model.training
    model.eval()
    flat = [p for p in problems for _ in range(k)]
    sampled: list[str] = []
    for i in range(0, len(flat), batch):
        chunk = [p.prompt for p in flat[i : i + batch]]
        sampled += sample_texts(
            model, tokenizer, chunk, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i
        )
    greedy = sample_texts(
        model, tokenizer, [p.prompt for p in problems], greedy=True, max_new_tokens=max_new_tokens
    )
    model.train(was_training)
    return {
        "avg_at_k": sum(reward(p, t) for p, t in zip(flat, sampled)) / max(len(flat), 1),
        "greedy_acc": sum(reward(p, t) for p, t in zip(problems, greedy)) / max(len(problems), 1),
        "k": k,
        "n_problems": len(problems),
        "temperature": temperature,
    }
