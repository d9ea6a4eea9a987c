"""The calibration sampler: greedy equals a naive argmax loop, padding-invariant, seeded."""

from __future__ import annotations

import torch

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.models.sampler import sample_texts, score
from satrl.types import Problem

TOK = build_char_tokenizer()
MODEL = build_tiny_model("dense", vocab_size=len(TOK), seed=5, num_hidden_layers=2)


def _naive_greedy(prompt: str, n: int) -> str:
    ids = TOK(prompt)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(MODEL(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == TOK.eos_token_id:
                break
            ids.append(nxt)
            out.append(nxt)
    return TOK.decode(out, skip_special_tokens=True)


def test_greedy_matches_naive_loop_and_ignores_left_padding():
    prompts = ["1+1=", "123+456=", "7*8="]  # different lengths -> left padding in the batch
    batch = sample_texts(MODEL, TOK, prompts, greedy=True, max_new_tokens=6)
    assert batch == [_naive_greedy(p, 6) for p in prompts]
    assert batch == [sample_texts(MODEL, TOK, [p], greedy=True, max_new_tokens=6)[0] for p in prompts]


def test_sampling_is_seeded():
    prompts = ["12+34="] * 16
    a = sample_texts(MODEL, TOK, prompts, seed=1, max_new_tokens=5)
    b = sample_texts(MODEL, TOK, prompts, seed=1, max_new_tokens=5)
    c = sample_texts(MODEL, TOK, prompts, seed=2, max_new_tokens=5)
    assert a == b and a != c
    assert all(len(t) <= 5 for t in a)


def test_score_counts_exact_matches():
    greedy = sample_texts(MODEL, TOK, ["5+5="], greedy=True, max_new_tokens=4)[0]
    probs = [Problem("a", "5+5=", greedy), Problem("b", "5+5=", greedy + "x")]
    s = score(MODEL, TOK, probs, lambda p, t: float(p.answer == t), k=4, max_new_tokens=4)
    assert s["greedy_acc"] == 0.5  # the first problem's answer is the greedy decode, the second's cannot be
    assert s["n_problems"] == 2 and s["k"] == 4 and 0.0 <= s["avg_at_k"] <= 0.5
