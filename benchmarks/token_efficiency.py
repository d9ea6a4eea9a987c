"""Token efficiency: how many of the trainer's token positions carry a real token, per ``train.microbatch_order``,
and the traced peak memory of one microbatch of the default GPU recipe. CPU only, no model weights.

    python -m benchmarks.token_efficiency                      # prints, writes the "Token efficiency" section
    python -m benchmarks.token_efficiency --json out.json      # also the numbers as JSON
    python -m benchmarks.token_efficiency --quick              # no trace (plans only), nothing written

Mixes (512 rows each = 32 prompts x 16 samples, as ``configs/qwen3_gpu.yaml``; seeded): *rl*, response lengths
lognormal with median 900 and sigma 0.8, capped at 4096 (what GRPO on math produces); *uniform*, response lengths
uniform on 100..4096. Prompt lengths: uniform on 64..512, one per prompt (its 16 samples share it).

Plans. The rows are cut by the trainer's own :func:`~satrl.training.trainer.plan_microbatches` at
``train.microbatch_tokens`` of the recipe (16,384), in the order the trainer takes them: *shuffled*, the epoch's
seeded permutation (:func:`~satrl.training.trainer.epoch_order`); *by_length*, longest first
(:func:`~satrl.training.trainer.length_order`). *decoder* = sum over microbatches of rows x longest row (the
positions the decoder runs) / real tokens (prompt + response); *head* = sum of rows x the microbatch's longest
response (the LM head's rows) / real response tokens; *head, batch width* = the same at the batch's longest
response, what the trainer did before the head was trimmed to each microbatch; *padded* = microbatches with a row
shorter than their longest (SDPA then takes a dense mask, not the causal kernel).

Trace. The recipe's settings (``configs/qwen3_gpu.yaml`` as shipped: bf16 autocast, activation checkpointing,
its ``logprob_chunk_tokens`` and ``microbatch_order``, sat_grpo with its KL term, so a bf16 reference model) on a
Qwen3-0.6B-shaped policy (benchmarks.memory's shape, full 28 layers, vocabulary 151,936) built under
``FakeTensorMode``: no bytes are allocated and nothing is computed, while torch's ``MemTracker`` counts every
tensor's bytes as the ops create and free them. One microbatch, the plan's largest (rows x longest), runs the
trainer's own microbatch body (policy log-probs, reference log-probs, the objective, ``aggregate``, backward)
with the weights, the AdamW state and the reference held. The peak is that of the trace's device, CPU: SDPA is
dispatched as on CPU (a padded microbatch takes the math kernel with its [rows, heads, L, L] scores, one layer at
a time under checkpointing), so a CUDA run, whose masked SDPA does not materialise them, should be lower.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

GiB = 2**30
ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "qwen3_gpu.yaml"
ROWS, GROUP, CAP = 512, 16, 4096
ORDERS = ("shuffled", "by_length")


def mix(name: str, seed: int = 0, rows: int = ROWS) -> tuple[list[int], list[int]]:
    """(prompt lengths, response lengths) of ``rows`` samples of mix ``name`` (rl or uniform)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(64, 513, (rows // GROUP,), generator=g).repeat_interleave(GROUP).tolist()
    if name == "rl":
        z = torch.randn(rows, generator=g, dtype=torch.float64)
        resp = (math.log(900) + 0.8 * z).exp().round().clamp(1, CAP).long().tolist()
    elif name == "uniform":
        resp = torch.randint(100, CAP + 1, (rows,), generator=g).tolist()
    else:
        raise ValueError(f"unknown mix {name!r}")
    return prompts, resp


def lengths_batch(prompts: list[int], responses: list[int]):
    """A collated-shape :class:`~satrl.types.Batch` of those lengths (token ids 0: only the shapes matter)."""
    from satrl.types import Batch

    B, T = len(prompts), max(responses)
    L = max(p + r for p, r in zip(prompts, responses))
    pos = torch.arange(L)[None, :]
    total = torch.tensor(prompts)[:, None] + torch.tensor(responses)[:, None]
    return Batch(
        input_ids=torch.zeros(B, L, dtype=torch.long), attention_mask=pos < total, prompt_len=torch.tensor(prompts),
        mask=torch.arange(T)[None, :] < torch.tensor(responses)[:, None], response_ids=torch.zeros(B, T, dtype=torch.long),
        behavior_logp=torch.zeros(B, T), versions=torch.zeros(B, T, dtype=torch.long), rewards=torch.zeros(B),
        group_index=torch.arange(B) // GROUP, routing=None, sample_ids=[f"s{i}" for i in range(B)],
    )  # fmt: skip


def ordered(batch, order: str, seed: int = 0):
    """The batch's rows in the order one step of ``microbatch_order=order`` cuts them (minibatches=1, epoch 0)."""
    from satrl.training.microbatches import epoch_order, length_order, split_rows

    rows = epoch_order(seed, 0, 0, batch.mask.shape[0])  # train_batch's permutation, then the step's own order
    batch = split_rows(batch, rows)
    return split_rows(batch, length_order(batch)) if order == "by_length" else batch


def efficiency(batch, budget: int) -> dict:
    """Token-position ratios of the trainer's plan of ``batch`` (already in the step's order)."""
    from satrl.training.microbatches import plan_microbatches

    plan = plan_microbatches(batch, budget)
    lengths = batch.attention_mask.sum(1)
    responses = lengths - batch.prompt_len
    rows = [p.end - p.start for p in plan]
    return {
        "microbatches": len(plan),
        "padded": sum(p.padded for p in plan),
        "decoder": sum(r * p.longest for r, p in zip(rows, plan)) / int(lengths.sum()),
        "head": sum(r * p.width for r, p in zip(rows, plan)) / int(responses.sum()),
        "head_batch_width": batch.mask.shape[0] * batch.mask.shape[1] / int(responses.sum()),
        "largest": max(range(len(plan)), key=lambda i: (rows[i] * plan[i].longest, plan[i].width)),
    }


def recipe():
    from satrl.config import load_config

    return load_config(RECIPE, [])


def trace_peak(cfg, batch, layers: int | None = None, vocab: int | None = None) -> dict:
    """Traced bytes (FakeTensorMode + MemTracker) of the plan's largest microbatch of ``batch`` (in step order)
    under ``cfg``'s trainer settings, on the Qwen3-0.6B shape (``layers``/``vocab``: a smaller one, for tests)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import Qwen3ForCausalLM

    from benchmarks.memory import SHAPES, VOCAB, qwen3_config
    from satrl.dtypes import CONFIG_DTYPES
    from satrl.objectives import aggregate
    from satrl.training.microbatches import plan_microbatches, row_slice
    from satrl.training.placement import OneDevice
    from satrl.training.scorer import _Scored
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    t = cfg.train
    shape = SHAPES["0.6B"]
    plan = plan_microbatches(batch, t.microbatch_tokens)
    p = plan[efficiency(batch, t.microbatch_tokens)["largest"]]
    config = qwen3_config(shape, layers or shape["num_hidden_layers"], vocab or VOCAB)

    class Traced(OneDevice):
        def place(self, model, uses_ref, device, dtype):  # as OneDevice's, without a deepcopy (fake parameters)
            ref = None
            if uses_ref:
                default = torch.get_default_dtype()
                torch.set_default_dtype(CONFIG_DTYPES[dtype])
                try:
                    ref = Qwen3ForCausalLM(config).eval()  # run under no_grad (MemTracker hooks every parameter)
                finally:
                    torch.set_default_dtype(default)
            return model.train(), ref

    settings = TrainerSettings(lr=t.lr, aggregation=cfg.objective.aggregation, microbatch_tokens=t.microbatch_tokens,
                               dtype=t.dtype, activation_checkpointing=t.activation_checkpointing,
                               logprob_chunk_tokens=t.logprob_chunk_tokens, microbatch_order=t.microbatch_order)  # fmt: skip
    with FakeTensorMode(allow_non_fake_inputs=True):
        tr = Trainer(Qwen3ForCausalLM(config), cfg.objective, settings, Traced(torch.device("cpu")))
        for q in tr.model.parameters():  # AdamW's state, as after the first step
            tr.opt.state[q] = {"step": torch.zeros(()), "exp_avg": torch.zeros_like(q), "exp_avg_sq": torch.zeros_like(q)}
        m = row_slice(batch, p.start, p.end)
        tracker = MemTracker()
        tracker.track_external(*[x for x in (tr.model, tr.opt, tr.ref_model) if x is not None])

        def body() -> torch.Tensor:  # Trainer.step's work on one microbatch
            logp, _ = tr.scorer.logp(tr.model, m, p)
            ref = None
            if tr.ref_model is not None:
                with torch.no_grad():
                    ref = tr.scorer.logp(tr.ref_model, m, p)[0]
            out = tr.objective(logp=logp, behavior_logp=m.behavior_logp, adv=torch.ones(p.end - p.start), mask=m.mask,
                               ref_logp=ref, lag=torch.zeros_like(m.versions), old_logp=None)  # fmt: skip
            return aggregate(out.loss, m.mask, tr.settings.aggregation)

        with tracker:  # under a module (_Scored), so that MemTracker accepts the LM head's calls chunk by chunk
            _Scored(tr.model)(lambda _: body()).backward()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    return {"rows": p.end - p.start, "longest": p.longest, "width": p.width, "chunk": tr.scorer.chunk_tokens,
            "peak_gib": peak["Total"] / GiB, **{f"{k.name.lower()}_gib": v / GiB for k, v in peak.items() if k != "Total"}}  # fmt: skip


def measure(quick: bool = False) -> dict:
    cfg = recipe()
    budget = cfg.train.microbatch_tokens
    res = {"budget": budget, "order": cfg.train.microbatch_order, "chunk": cfg.train.logprob_chunk_tokens, "mixes": {}}
    for name in ("rl", "uniform"):
        prompts, resp = mix(name)
        batch = lengths_batch(prompts, resp)
        out = {"rows": len(resp), "median_response": int(torch.tensor(resp).median()), "real_tokens": sum(prompts) + sum(resp),
               "response_tokens": sum(resp)}  # fmt: skip
        for order in ORDERS:
            out[order] = efficiency(ordered(batch, order), budget)
        if not quick:
            out["trace"] = trace_peak(cfg, ordered(batch, cfg.train.microbatch_order))
        res["mixes"][name] = out
    return res


def report(res: dict) -> str:
    lines = [f"Plans at {res['budget']:,} tokens per microbatch (512 rows; ratios of token positions to real tokens):", "",
             "| mix | median response | order | microbatches | padded | decoder | head | head, batch width |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, m in res["mixes"].items():
        for order in ORDERS:
            e = m[order]
            lines.append(f"| {name} | {m['median_response']} | {order} | {e['microbatches']} | {e['padded']} "
                         f"| {e['decoder']:.2f}x | {e['head']:.2f}x | {e['head_batch_width']:.2f}x |")  # fmt: skip
    traced = {k: m["trace"] for k, m in res["mixes"].items() if "trace" in m}
    if traced:
        lines += ["", f"Traced peak of the largest microbatch, configs/qwen3_gpu.yaml as shipped (microbatch_order="
                  f"{res['order']}, logprob_chunk_tokens={res['chunk']}), Qwen3-0.6B shape (GiB):", "",
                  "| mix | rows x longest (width) | chunk | params | optimizer | gradients | activations | temporaries | peak |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for name, t in traced.items():
            lines.append(f"| {name} | {t['rows']} x {t['longest']} ({t['width']}) | {t['chunk']} | {t['param_gib']:.1f} "
                         f"| {t['opt_gib']:.1f} | {t['grad_gib']:.1f} | {t['act_gib']:.1f} | {t['temp_gib']:.1f} "
                         f"| {t['peak_gib']:.1f} |")  # fmt: skip
        worst = max(t["peak_gib"] for t in traced.values())
        lines += ["", f"Target <= 20 GiB: {worst:.1f} GiB, {'met' if worst <= 20 else 'NOT met'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="plans only (no trace), nothing written to docs")
    ap.add_argument("--json", type=Path, help="also write the numbers here as JSON")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res = measure(args.quick)
    body = report(res)
    print(body)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if not args.quick:
        from benchmarks._report import write_section

        write_section("Token efficiency", "python -m benchmarks.token_efficiency", __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
