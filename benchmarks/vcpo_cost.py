"""VCPO's trainer cost against GRPO's: one rollout batch's training (advantages, then the optimizer step).

    .venv/bin/python -m benchmarks.vcpo_cost                 # both shapes, written to docs/benchmarks.md
    .venv/bin/python -m benchmarks.vcpo_cost --quick         # few repeats, printed only

What is timed: ``Trainer.train_batch`` on one batch, the whole of what the trainer does with a rollout batch
(the advantages, for ``vcpo`` with its off-policy optimal baseline and so the per-sequence score norms, then one
optimizer step with the ESS step size), ``grpo`` and ``vcpo`` interleaved (A, B, A, B, ...) with a fresh copy
of the weights each so that both train the same weights each time; ratio = median of the adjacent pairs' ratios.
The row "per-row loop" is ``vcpo`` with the score norms taken as the trainer took them before issue 45: one
forward and one backward per response (here for comparison only; the shipped path is one batched pass).

Shapes:

- **trial**: the repair trial's trainer (``configs/grids/repair_trial.yaml``: the tiny MoE, lr 5e-5, one
  optimizer step per batch, 1 thread; ``satrl.launch.setup.trainer_settings`` of that config), on a
  batch of its size, 16 prompts x 8 responses, arithmetic prompts, responses of 4-24 tokens, behaviour
  log-probs = the trainer's + N(0, 0.05) per token (stale rollouts);
- **qwen3-0.6b**: random weights in Qwen3-0.6B's shape (hidden 1024, 16/8 heads of 128, MLP 3072, vocabulary
  151,936, tied embeddings) with ``--layers`` decoder layers (28 in the real model; fewer here, or a step takes
  minutes on 2 cores), ``--rows`` responses of ``--tokens`` tokens in one microbatch, fp32, full logits (the
  score pass runs the LM head once per microbatch: at 4 x 1024 tokens its fp32 [tokens, 151,936] logits, their
  log-softmax and gradients outgrew this machine's 24 GiB; with ``train.logprob_chunk_tokens`` > 0 the score
  pass takes the LM head's share row by row, ``satrl.training.score_norms.ChunkedHead``, which this benchmark
  does not time yet).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from satrl.objectives import resolve_objective
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer
from satrl.types import Batch, Sample

TRIAL_OVERRIDES = ["model.name=tiny-arith-moe", "engine.numerics=bf16", "train.lr=5e-5", "train.minibatches=1",
                   "train.ppo_epochs=1", "train.threads=1"]  # fmt: skip


def per_row_scores(t: Trainer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's score norms before issue 45: one forward and one backward per row (comparison only)."""
    from satrl.training.microbatches import Micro, row_slice, to_device

    dev_mb = to_device(batch, t.device)
    params = [p for p in t.model.parameters() if p.requires_grad]
    log_w, sq = [], []
    for i, length in enumerate(batch.attention_mask.sum(1).tolist()):
        m = row_slice(dev_mb, i, i + 1)
        logp, _ = t.scorer.logp(t.model, m, Micro(i, i + 1, length, False, batch.mask.shape[1]))
        grads = torch.autograd.grad(torch.where(m.mask, logp, 0.0).sum(), params, allow_unused=True)
        sq.append(sum(g.double().square().sum() for g in grads if g is not None))
        log_w.append(torch.where(m.mask, logp.detach().double() - m.behavior_logp.double(), 0.0).sum())
    return torch.stack(log_w), torch.stack(sq)


def stale_batch(model, tok, prompts: list[str], lengths: list[int], seed: int = 0) -> Batch:
    """Rows of ``prompts`` (8 responses each) with random responses of ``lengths``; behaviour log-probs are the
    model's own plus N(0, 0.05) noise, rewards 0/1 at random."""
    from satrl.pipeline.buffer import collate
    from satrl.training.logprobs import response_logp

    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    samples = [Sample(f"s{i}", f"g{i // 8}", tok(prompts[i // 8])["input_ids"] if tok else [1] * 16,
                      torch.randint(3, vocab, (n,), generator=g).tolist(), torch.zeros(n), 0,
                      float(torch.rand(1, generator=g) < 0.5))
               for i, n in enumerate(lengths)]  # fmt: skip
    batch = collate(samples, tok.pad_token_id if tok else 0)
    with torch.no_grad():
        logp, _ = response_logp(model, batch, 1.0)
    batch.behavior_logp = torch.where(batch.mask, logp + 0.05 * torch.randn(logp.shape, generator=g), 0.0)
    return batch


def time_pair(trainers: dict[str, Trainer], batch: Batch, repeats: int) -> dict[str, list[float]]:
    """Each trainer's ``train_batch`` wall time, interleaved, each from the same starting weights."""
    start = {k: copy.deepcopy(t.model.state_dict()) for k, t in trainers.items()}
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for r in range(repeats):
        order = list(trainers) if r % 2 == 0 else list(reversed(trainers))
        for k in order:
            t = trainers[k]
            t.model.load_state_dict(start[k])
            t0 = time.perf_counter()
            list(t.train_batch(batch, 0, lambda v: None, stop_at=t.version + 1))
            times[k].append(time.perf_counter() - t0)
    return times


def paired_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def trial_case(repeats: int) -> dict[str, list[float]]:
    from satrl.config import load_config
    from satrl.launch.setup import trainer_settings
    from satrl.models import load_policy

    torch.set_num_threads(1)
    model, tok = load_policy("tiny-arith-moe")
    g = torch.Generator().manual_seed(0)
    prompts = [f"{int(a)}+{int(b)}=" for a, b in torch.randint(0, 1000, (16, 2), generator=g)]
    lengths = torch.randint(4, 25, (128,), generator=g).tolist()
    batch = stale_batch(model, tok, prompts, lengths)
    trainers = {}
    for name in ("grpo", "vcpo", "per-row loop"):
        cfg = load_config("configs/grpo.yaml", [*TRIAL_OVERRIDES, f"objective.name={'grpo' if name == 'grpo' else 'vcpo'}"])
        trainers[name] = Trainer(copy.deepcopy(model), cfg.objective, trainer_settings(cfg))
    row = trainers["per-row loop"]
    row.advantages.sequence_scores = lambda b: per_row_scores(row, b)
    return time_pair(trainers, batch, repeats)


def qwen3_case(layers: int, rows: int, tokens: int, repeats: int) -> dict[str, list[float]]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(torch.get_num_threads())
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                      max_position_embeddings=tokens + 32)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float().eval()
    batch = stale_batch(model, None, ["x"] * rows, [tokens] * rows)
    settings = TrainerSettings(lr=1e-6, microbatch_tokens=rows * (tokens + 16), decompose=False)
    trainers = {name: Trainer(copy.deepcopy(model) if name == "grpo" else model, resolve_objective(name), settings)
                for name in ("grpo", "vcpo")}  # fmt: skip
    return time_pair(trainers, batch, repeats)


def table(label: str, times: dict[str, list[float]]) -> list[str]:
    base = times["grpo"]
    return [f"| {label} | {k} | {statistics.median(v):.3f} | {paired_ratio(v, base):.2f} | {len(v)} |"
            for k, v in times.items()]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few repeats, small Qwen3 case, print only")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--qwen-repeats", type=int, default=2)
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.layers, a.rows, a.tokens, a.qwen_repeats = 3, 1, 2, 64, 2
    lines = ["| shape | trainer | s per batch (median) | x grpo (paired) | repeats |", "| --- | --- | ---: | ---: | ---: |"]
    lines += table("trial (tiny MoE, 128 responses, 1 thread)", trial_case(a.repeats))
    print("\n".join(lines), flush=True)
    q = qwen3_case(a.layers, a.rows, a.tokens, a.qwen_repeats)
    lines += table(f"Qwen3-0.6B shape, {a.layers} layers, {a.rows} x {a.tokens} tokens, "
                   f"{torch.get_num_threads()} threads", q)  # fmt: skip
    print("\n".join(lines[-2:]), flush=True)
    if not a.quick:
        import os

        from benchmarks._report import write_section

        cmd = " ".join(["python -m benchmarks.vcpo_cost", *(sys.argv[1:] if argv is None else argv)])
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        write_section("VCPO cost", cmd, "\n".join(lines) + "\n\n" + NOTE + f" Load average at the end: {load} (1 / 5 / "
                      "15 min) on 2 cores; above ~1 the machine was shared and the paired ratios are the numbers to read.")
    return 0


NOTE = ("One rollout batch's training (`Trainer.train_batch`: advantages, then one optimizer step), `grpo` and `vcpo` "
        "interleaved from the same weights; x grpo is the median of adjacent pairs' ratios. `per-row loop`: vcpo with "
        "the score norms taken as before issue 45 (one forward and backward per response), for comparison. "
        "The script's docstring gives the batches.")  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main())
