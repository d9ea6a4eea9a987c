"""The trainer parts of benchmarks/gpu_check.py: a Qwen3-0.6B-shaped trainer's peak memory, tokens/s and MFU
at 16k tokens per microbatch, and SAT on the device against the same steps on CPU (see gpu_check's docstring)."""

from __future__ import annotations

import copy
import time

import torch

from benchmarks.memory import QUICK_SHAPES, SHAPES, VOCAB, build_trainer, one_row_batch, param_count

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12}  # dense bf16, SXM parts


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_flops_per_token(shape: dict, vocab: int, seq: int) -> float:
    """6 x matmul parameters (the LM head included, the embedding lookup not) + causal attention."""
    tied, lookup = shape["tie_word_embeddings"], vocab * shape["hidden_size"]
    p_matmul = param_count(shape, vocab=vocab) - (0 if tied else lookup)  # tied: the one matrix is the LM head
    attn = 6 * shape["num_hidden_layers"] * shape["num_attention_heads"] * shape["head_dim"] * seq
    return 6 * p_matmul + attn


def throughput(device: str, quick: bool, steps: int) -> dict:
    """Peak memory, tokens/s and MFU of Trainer.step on one row of ``tokens`` tokens (bf16, checkpointing,
    chunked log-probs; sat_grpo as preset, with its KL term: a bf16 reference model and its forward)."""
    from satrl.objectives import resolve_objective

    shape, vocab, tokens = (QUICK_SHAPES["tiny"], 1000, 256) if quick else (SHAPES["0.6B"], VOCAB, 16384)
    trainer = build_trainer(shape, shape["num_hidden_layers"], vocab, "after", resolve_objective("sat_grpo"),
                            device=device, lr=1e-6)  # fmt: skip
    batch, adv = one_row_batch(tokens, vocab), torch.ones(1)
    cuda = device.startswith("cuda")
    trainer.step(batch, adv)  # warm-up: AdamW state, kernels
    _sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    finite = True
    for _ in range(steps):
        finite &= trainer.step(batch, adv)["skipped"] == 0.0
    _sync(device)
    wall = time.perf_counter() - t0
    tok_s = tokens * steps / wall
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    mfu = model_flops_per_token(shape, vocab, tokens) * tok_s / peak if peak else None
    return {
        "shape": "tiny" if quick else "Qwen3-0.6B", "tokens": tokens, "steps": steps, "s_per_step": wall / steps,
        "tokens_per_s": tok_s, "mfu": mfu, "finite": finite,
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
    }  # fmt: skip


def _rows(n: int, vocab: int, seed: int = 0):
    from satrl.pipeline.buffer import collate
    from satrl.types import Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt = torch.randint(0, vocab, (4 + i % 3,), generator=g).tolist()
        resp = torch.randint(0, vocab, (6 + 3 * (i % 4),), generator=g).tolist()
        blp = -torch.rand(len(resp), generator=g) * 3
        samples.append(Sample(f"s{i}", f"g{i // 4}", prompt, resp, blp, 0, float(i % 2)))
    return collate(samples, 0)


def sat_parity(device: str, steps: int = 2, rtol: float = 1e-4) -> dict:
    """sat_grpo steps of the tiny policy on CPU and on ``device`` (fp32, TF32 off): the loss and every metric
    within 1e-6 + rtol x |value|, and each weight tensor within rtol in relative norm."""
    from satrl.dtypes import set_tf32
    from satrl.models import build_tiny_model
    from satrl.objectives import resolve_objective
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    model = build_tiny_model("dense", vocab_size=52, seed=0)
    batch = _rows(16, 52)
    adv = torch.linspace(-1, 1, 16)
    runs = []
    for where in ("cpu", device):
        set_tf32(False)
        settings = TrainerSettings(lr=1e-3, microbatch_tokens=96, device=where)
        t = Trainer(copy.deepcopy(model), resolve_objective("sat_grpo"), settings)
        metrics = [t.step(batch, adv) for _ in range(steps)]
        runs.append((metrics, {k: v.detach().cpu() for k, v in t.model.state_dict().items()}))
    (m_cpu, w_cpu), (m_dev, w_dev) = runs
    atol = 1e-6  # metrics that are rounding noise at lag 0 (d ~ 1e-7) are compared absolutely
    worst_metric = max(abs(a[k] - b[k]) / (atol + rtol * abs(a[k])) for a, b in zip(m_cpu, m_dev) for k in a)
    worst_weight = max(float((w_cpu[k] - w_dev[k]).norm() / w_cpu[k].norm().clamp(min=1e-12)) for k in w_cpu)
    if torch.backends.cuda.matmul.allow_tf32 and device.startswith("cuda"):
        raise RuntimeError("TF32 was on during the parity check")
    # metric_tol: the worst |cpu - device| / (1e-6 + rtol |cpu|), <= 1 when every metric is within tolerance
    return {"metric_tol": worst_metric, "weight_rel": worst_weight,
            "equal": worst_metric <= 1 and worst_weight <= rtol, "rtol": rtol}  # fmt: skip


def rl_batch(device: str, quick: bool, seed: int = 0) -> dict:
    """One RL-shaped rollout batch through ``Trainer.train_batch`` with configs/qwen3_gpu.yaml's trainer settings
    (its objective with the KL term, so a reference model; bf16, checkpointing, its log-prob chunk and microbatch
    order), pi_old (the recomputed denominator) and the d split (``decompose``, one snapshot forward): 512 rows of
    the token-efficiency benchmark's RL mix (lognormal responses, median 900, cap 4096) on the Qwen3-0.6B shape;
    ``quick``: 16 rows (one group, still several microbatches) of a tenth the length on the tiny shape, without the warm-up. After a warm-up step on 8 rows, timed to the
    device's end. Real tokens / s counts prompt + response tokens; MFU counts 6 FLOPs per matmul parameter per
    token for the training forward and backward and 2 for each no-grad forward (reference, pi_old, snapshot), the
    LM head at every token, plus causal attention, over the dense bf16 peak; recomputation is not useful work."""
    from benchmarks.token_efficiency import ROWS, mix, recipe
    from satrl.dtypes import set_tf32
    from satrl.pipeline.buffer import collate
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer
    from satrl.types import Sample

    cfg = recipe()
    t = cfg.train
    set_tf32(t.tf32)  # process-wide, as satrl train sets it where it starts
    shape, vocab = (QUICK_SHAPES["tiny"], 1000) if quick else (SHAPES["0.6B"], VOCAB)
    rows, budget = (16, 512) if quick else (ROWS, t.microbatch_tokens)  # quick: the paths, not the numbers
    prompts, responses = mix("rl", seed, rows)
    if quick:
        prompts, responses = [max(1, p // 10) for p in prompts], [max(1, r // 10) for r in responses]
    g = torch.Generator().manual_seed(seed)
    samples = [Sample(f"s{i}", f"g{i // 16}", torch.randint(0, vocab, (p,), generator=g).tolist(),
                      torch.randint(0, vocab, (r,), generator=g).tolist(), -torch.rand(r, generator=g) * 3, 0,
                      float(i % 2)) for i, (p, r) in enumerate(zip(prompts, responses))]  # fmt: skip
    batch = collate(samples, 0)
    from benchmarks.memory import random_qwen3

    settings = TrainerSettings(lr=1e-6, aggregation=cfg.objective.aggregation, microbatch_tokens=budget, device=device,
                               dtype=t.dtype, activation_checkpointing=t.activation_checkpointing,
                               logprob_chunk_tokens=t.logprob_chunk_tokens, microbatch_order=t.microbatch_order,
                               recomputed_denominator=True, decompose=True, compile=t.compile)  # fmt: skip
    trainer = Trainer(random_qwen3(shape, shape["num_hidden_layers"], vocab), cfg.objective, settings)
    snapshots = lambda v: trainer.export.weights()  # noqa: E731  (every row at the trainer's version: lag 0)
    if not quick:  # quick reports no number worth a warm-up: the timed call below runs the same code
        warm = collate(samples[:8], 0)
        for _ in trainer.train_batch(warm, 0, snapshots, stop_at=trainer.version + 1):
            pass
    cuda = device.startswith("cuda")
    _sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    steps = list(trainer.train_batch(batch, 1, snapshots, stop_at=trainer.version + 1))
    _sync(device)
    wall = time.perf_counter() - t0
    lengths = [p + r for p, r in zip(prompts, responses)]
    no_grad = 2 + (trainer.ref_model is not None)  # forwards without a backward: pi_old, the snapshot, the reference
    flops = sum(n * model_flops_per_token(shape, vocab, n) * (1 + no_grad / 3) for n in lengths)
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return {
        "shape": "tiny" if quick else "Qwen3-0.6B", "rows": rows, "real_tokens": sum(lengths),
        "order": t.microbatch_order, "chunk": trainer.scorer.chunk_tokens, "wall_s": wall,
        "tokens_per_s": sum(lengths) / wall, "mfu": flops / wall / peak if peak else None,
        "finite": all(m["skipped"] == 0.0 for m, _ in steps) and len(steps) == 1,
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }  # fmt: skip
