"""GPU check: a Qwen3-0.6B-shaped trainer at 16k tokens per microbatch (bf16, activation checkpointing, chunked
log-probs): peak memory, trainer tokens/s and MFU; SAT on CUDA against the same steps on CPU; the torch engine and
the trainer in the ``satrl train`` loop; the objective timings. One prepared script for a lent GPU machine (no
vLLM, no network there); results go to docs/benchmarks.md, section "GPU".

    python -m benchmarks.gpu_check                      # on the GPU machine: writes the section
    python -m benchmarks.gpu_check --device cpu --quick  # logic smoke run anywhere (nothing written)

    python benchmarks/gpu_check.py --device cpu --quick  # the same: the script puts the clone's src/ on the path

Dependencies on the GPU machine: torch and transformers are there; satrl's objectives and config are pydantic
models, and pydantic is not, so carry its wheels (pure Python except ``pydantic_core``, whose wheel must match
the machine's Python) in an ignored folder and install them offline first:
``pip install --no-index --find-links WHEELS pydantic`` (pydantic, pydantic_core, annotated_types,
typing_inspection). satrl itself needs no install: where it is not importable the script adds the clone's
``src`` to ``sys.path``. Without a dependency it stops at once naming it (and, for pydantic, the instruction
above); without satrl's sources it says that instead.

Part 1 builds a randomly initialised Qwen3-0.6B-shaped policy (hidden 1024, 28 layers, 16 heads, 8 KV heads,
head_dim 128, intermediate 3072, vocabulary 151936, tied embeddings; the config is local, no hub) and runs
``Trainer.step`` on one 16,384-token row (sat_grpo as preset: its k3 KL term at 1e-3, so a bf16 reference model
and its forward) with ``dtype=bf16``,
``activation_checkpointing=True`` and ``logprob_chunk_tokens=2048``: a warm-up step, then timed steps (CUDA
synchronised). MFU counts model FLOPs, 6 per parameter per token (the LM head included, the embedding lookup
not) plus causal attention (6 * layers * heads * head_dim * sequence length per token), over the device's dense
bf16 peak (989 TFLOP/s on H100/H200 SXM); activation recomputation is not counted as useful work.
Part 2 trains the tiny policy for two steps of sat_grpo on the same batch on CPU and on the device, fp32 with
TF32 off, and compares the loss, every metric and the weights (relative tolerance 1e-4).
Part 3 runs the real ``satrl train`` loop (sequential backend) on the tiny dense and MoE policies with
``train.device`` and the engine's ``device`` set, and reports per-step time and d at lag 0 (implementation
mismatch only). Part 4 times ``policy_loss`` + ``aggregate`` + ``backward`` of grpo and sat_grpo on device
tensors (CUDA events, median of repeats) and reads the peak allocated memory of one step.
Part 5, only where vLLM is installed (not on the lent machine so far: it then prints that it skipped): the tiny
policy's ``satrl train`` loop on ``engine=vllm``, ``backend=local``, with ``weights.transport=inproc`` and
``vllm`` (vLLM's weight-transfer API on the GPU), which must give identical metrics.
Part 6: ``satrl train`` on the tiny policy under ``torchrun --nproc_per_node=1`` (the data-parallel trainer:
NCCL on CUDA, FSDP2 moving rank 0's loaded policy to the device one unit at a time, ``MixedPrecisionPolicy``
in bf16, a DCP checkpoint) against the same run in one process, in fp32 and in bf16: the largest relative
difference of any logged metric. One GPU cannot host two NCCL ranks, so more ranks are tested on CPU only.
Expected: 0 on CPU (both runs autocast the same fp32 weights); on CUDA fp32 within 1e-4 (reduction order), and
bf16 within 5e-2: FSDP2's MixedPrecisionPolicy casts the parameters to bf16 once, autocast casts per op, and
in bf16 d ~ 1e-3 metrics differ at bf16's resolution (8 bits: 4e-3 relative) and compound over the steps.
Part 7: one RL-shaped rollout batch (512 rows, lognormal responses, median 900, cap 4096) through
``Trainer.train_batch`` with configs/qwen3_gpu.yaml's trainer settings, pi_old and the d split
(``benchmarks.gpu_trainer.rl_batch``): real tokens/s, MFU and peak memory. Part 8: the ``dist`` transport from
the trainer's device to an engine process, seconds per version of the Qwen3-0.6B shape (``benchmarks.weight_sync``'s
``dist_path`` with the trainer's weights on the device). ``--out DIR`` also writes the tables to DIR/gpu_check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _import_path() -> None:
    """Make ``satrl`` (the clone's src/) and ``benchmarks`` importable without PYTHONPATH or an install."""
    import importlib.util

    if str(ROOT) not in sys.path:  # `python benchmarks/gpu_check.py` puts benchmarks/, not the root, first
        sys.path.insert(0, str(ROOT))
    if importlib.util.find_spec("satrl") is None and (ROOT / "src" / "satrl").is_dir():
        sys.path.insert(0, str(ROOT / "src"))


_import_path()
try:
    from satrl.objectives import aggregate, policy_loss
except ModuleNotFoundError as e:  # a dependency, or satrl itself (see the docstring)
    if e.name == "satrl" or (e.name or "").startswith("satrl."):
        raise SystemExit(f"{e}: satrl's sources are not at {ROOT / 'src'}: run this script from a clone of satrl") from None
    hint = ": install the carried wheels first: pip install --no-index --find-links WHEELS pydantic" if "pydantic" in (e.name or "") else ""
    raise SystemExit(f"satrl needs {e.name!r}, which is not installed here{hint}") from None

RUN = [
    "train.prompts_per_batch=8", "train.group_size=4", "train.minibatches=2", "engine.max_new_tokens=8",
    "eval.val_problems=8", "eval.test_problems=8", "eval.k=2", "eval.every=0", "checkpoint.every=100", "backend=sequential",
    "objective.name=sat_grpo", "lag.schedule=broadcast", "lag.n=2",
]  # fmt: skip
# --quick: half the work, one trainer thread (a smoke run on a shared CPU: a second thread mostly spin-waits)
QUICK_RUN = [*RUN, "train.prompts_per_batch=4", "eval.val_problems=2", "eval.test_problems=2", "train.threads=1"]


def train_check(device: str, model: str, steps: int, out: Path, run: list[str] = RUN) -> dict:
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    overrides = [*run, f"model.name={model}", f"steps={steps}", f"train.device={device}", f"out={out}"]
    cfg = load_config(None, overrides)
    cfg.engine.kwargs = {"device": device}
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "model": model, "steps": len(rows), "wall_s": wall,
        "d_pi_step1": rows[0]["mismatch/d_pi"], "gate_rate": statistics.mean(r.get("obj/gate_rate", 0.0) for r in rows),
        "finite": all(torch.isfinite(torch.tensor(r["loss"])) for r in rows),
        "final_avg_at_k": json.loads((out / "summary.json").read_text())["final_avg_at_k"],
    }  # fmt: skip


def vllm_transport_lines(steps: int, root: Path, run: list[str] = RUN) -> list[str]:
    """Part 5: weights.transport=vllm against inproc on the vLLM engine (equal metrics), where vLLM is installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("part 5 skipped: vLLM is not installed here")
        return ["", "weights.transport=vllm on the GPU: not run (vLLM is not installed on this machine)."]
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    rows, walls = {}, {}
    for transport in ("inproc", "vllm"):
        out = root / f"vllm-{transport}"
        overrides = [*run, "backend=local", "engine=vllm", f"weights.transport={transport}", f"steps={steps}", f"out={out}"]
        t0 = time.perf_counter()
        train(load_config(None, overrides))
        walls[transport] = time.perf_counter() - t0
        rows[transport] = [{k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("perf/")}
                           for x in (out / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    same = rows["inproc"] == rows["vllm"]
    print(json.dumps({"vllm_transport_equal": same, **{f"wall_s_{k}": v for k, v in walls.items()}}))
    return ["", f"weights.transport=vllm vs inproc on engine=vllm (tiny policy, {steps} steps, lag 2): metrics "
            f"{'identical' if same else 'DIFFERENT'}; wall {walls['vllm']:.1f} s vs {walls['inproc']:.1f} s."]  # fmt: skip


def dp_lines(device: str, steps: int, root: Path, run: list[str] = RUN, one_fp32: Path | None = None) -> list[str]:
    """Part 6: ``satrl train`` under torchrun with one rank against one process, fp32 and bf16. The one-process
    run is ``train`` in this process (what ``satrl train`` calls; it sets the trainer's thread count itself): a
    second interpreter importing satrl again would only add its start-up. ``one_fp32``: the out folder of that
    same fp32 run made already (part 3's tiny-arith row, trained with the same overrides), not trained again."""
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    base = [*run, "model.name=tiny-arith", f"steps={steps}", f"train.device={device}", f"engine.kwargs.device={device}",
            f"checkpoint.every={steps}"]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]  # = torchrun
    lines = ["", "| satrl train, tiny policy | steps | largest relative metric difference, 1-rank DP vs one process "
             "| expected here | within |", "| --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    for dtype in ("fp32", "bf16"):
        rows = {}
        for how in ("one", "dp"):
            out = root / f"dp-{dtype}-{how}"
            overrides = [*base, f"train.dtype={dtype}", f"out={out}"]
            if how == "one" and dtype == "fp32" and one_fp32 is not None:
                out = one_fp32
            elif how == "one":
                train(load_config(None, overrides))
            else:
                cmd = [*torchrun, "-m", "satrl", "train", *overrides, "--no-progress"]
                path = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])  # uninstalled
                env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd[:6])} ... failed: {done.stderr[-2000:]}")
            rows[how] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        worst = max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-6) for a, b in zip(rows["dp"], rows["one"])
                    for k in b if k != "wall_s" and not k.startswith("perf/") and isinstance(b[k], float))  # fmt: skip
        bound = DP_EXPECTED[dtype] if device.startswith("cuda") else 0.0
        print(json.dumps({"dp_dtype": dtype, "steps": len(rows["dp"]), "worst_rel": worst, "expected": bound}))
        lines.append(f"| {dtype} | {len(rows['dp'])} | {worst:.1e} | {'0 (bits)' if bound == 0 else f'<= {bound:g}'} "
                     f"| {worst <= bound} |")  # fmt: skip
    return lines


DP_EXPECTED = {"fp32": 1e-4, "bf16": 5e-2}  # on CUDA (docstring, part 6); on CPU the runs agree bit for bit


def rl_lines(device: str, quick: bool) -> list[str]:
    """Part 7: one RL-shaped rollout batch through train_batch (pi_old and the d split included)."""
    from benchmarks.gpu_trainer import rl_batch

    r = rl_batch(device, quick)
    print(json.dumps(r))
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
    mem = "-" if r["peak_alloc_gib"] is None else f"{r['peak_alloc_gib']:.1f}"
    return ["", "| RL batch through train_batch (pi_old, d split, reference) | rows | real tokens | microbatch_order "
            "| log-prob chunk | s | real tokens / s | MFU | peak GiB allocated | finite |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
            f"| {r['shape']}, configs/qwen3_gpu.yaml trainer settings | {r['rows']} | {r['real_tokens']:,} | {r['order']} "
            f"| {r['chunk']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {mfu} | {mem} | {r['finite']} |"]  # fmt: skip


def weight_lines(device: str, quick: bool, versions: int) -> list[str]:
    """Part 8: the dist transport from the trainer's device to an engine process, per version."""
    from benchmarks.memory import QUICK_SHAPES, SHAPES, VOCAB
    from benchmarks.weight_sync import dist_path

    shape, vocab, name = (QUICK_SHAPES["tiny"], 1000, "tiny") if quick else (SHAPES["0.6B"], VOCAB, "Qwen3-0.6B")
    r = dist_path(shape, vocab, versions, device=device)
    print(json.dumps({"weights": name, "device": device, **r}))
    return ["", "| weights.transport=dist, trainer on the device -> engine process | versions | s / version (median) "
            "| peak host GiB |", "| --- | ---: | ---: | ---: |",
            f"| {name} on {device}, bf16 buckets of 256 MiB | {versions} | {r['sync_s']:.2f} | {r['peak'] / 2**30:.2f} |"]  # fmt: skip


def _inputs(n: int, device: str, T: int = 1024) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    b, t = max(1, n // T), min(T, n)
    logp = -torch.rand(b, t, generator=g, device=device) * 3.0
    return {
        "logp": logp.requires_grad_(),
        "behavior_logp": logp.detach() + 0.05 * torch.randn(b, t, generator=g, device=device),
        "adv": torch.randn(b, generator=g, device=device),
        "mask": torch.ones(b, t, dtype=torch.bool, device=device),
    }


def _step(preset: str, x: dict[str, torch.Tensor]) -> None:
    x["logp"].grad = None
    out = policy_loss(preset, **x)
    aggregate(out.loss, x["mask"], "token-mean").backward()


def objective_check(device: str, n: int, repeats: int) -> dict:
    cuda = device.startswith("cuda")
    x = _inputs(n, device)
    out = {}
    for preset in ("grpo", "sat_grpo"):
        _step(preset, x)  # warm-up
        times = []
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _step(preset, x)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                _step(preset, x)
                times.append(time.perf_counter() - t0)
        peak = None
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            _step(preset, x)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        out[preset] = {"ms": statistics.median(times) * 1e3, "peak_mib": None if peak is None else peak / 2**20}
    del x
    if cuda:
        torch.cuda.empty_cache()
    return out


def trainer_lines(device: str, quick: bool) -> list[str]:
    """Parts 1 and 2: the 0.6B-shaped trainer at 16k tokens, and SAT on the device against CPU (``quick``: one
    step each side, which already moves the weights: tests/test_gpu_check.py's skewed-lr run fails at one)."""
    from benchmarks.gpu_trainer import sat_parity, throughput

    r = throughput(device, quick, steps=2 if quick else 5)
    print(json.dumps(r))
    mem = "-" if r["peak_alloc_gib"] is None else f"{r['peak_alloc_gib']:.1f} / {r['peak_reserved_gib']:.1f}"
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
    parity_steps = 1 if quick else 2
    p = sat_parity(device, steps=parity_steps)
    print(json.dumps(p))
    return [
        "| trainer | tokens / microbatch | timed steps | s / step | tokens / s | MFU | peak GiB (allocated / reserved) "
        "| finite |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {r['shape']} bf16 + checkpointing + chunked log-probs | {r['tokens']} | {r['steps']} | {r['s_per_step']:.2f} "
        f"| {r['tokens_per_s']:.0f} | {mfu} | {mem} | {r['finite']} |", "",
        "Anchor: prime-rl's trainer benchmark gives 11.9k tokens/s for Qwen3-0.6B at 16K sequence length on one H100.",
        "",
        f"SAT on {device} vs CPU (tiny policy, sat_grpo, {parity_steps} steps, fp32, TF32 off): every metric within 1e-6 + "
        f"{p['rtol']:g} x |value| (worst at {p['metric_tol']:.2f} of that), weights within {p['weight_rel']:.1e} "
        f"relative norm: {'equal' if p['equal'] else 'NOT equal'} within tolerance.",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes and 2 steps; nothing written to the docs")
    ap.add_argument("--out", type=Path, help="also write the tables to OUT/gpu_check.md (and the JSON lines printed)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on the GPU machine, or pass --device cpu --quick for a smoke run")
    threads = torch.get_num_threads()
    if args.quick:  # the in-process parts on one thread too, as QUICK_RUN's loop (restored at the end)
        torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    steps, run = (2, QUICK_RUN) if args.quick else (8, RUN)
    lines = trainer_lines(args.device, args.quick) + [""]
    lines += ["| policy | steps (lag 2) | wall s | s/step | d at lag 0 (step 1) | mean gate rate | final avg@k | finite |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("tiny-arith", "tiny-arith-moe"):  # checkpoint at the end: tiny-arith's is part 6's fp32 run
            r = train_check(args.device, model, steps, Path(tmp) / model, [*run, f"checkpoint.every={steps}"])
            print(json.dumps(r))
            lines.append(
                f"| {model} | {r['steps']} | {r['wall_s']:.1f} | {r['wall_s'] / r['steps']:.2f} | {r['d_pi_step1']:.2e} "
                f"| {r['gate_rate']:.3f} | {r['final_avg_at_k']:.3f} | {r['finite']} |"
            )
        lines += vllm_transport_lines(steps, Path(tmp), run)
        lines += dp_lines(args.device, steps, Path(tmp), run, one_fp32=Path(tmp) / "tiny-arith")
    lines += rl_lines(args.device, args.quick)
    lines += weight_lines(args.device, args.quick, versions=2 if args.quick else 3)
    sizes = [1 << 16, 1 << 18] if args.quick else [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    lines += ["", "| tokens | grpo ms | sat_grpo ms | x grpo (time) | grpo peak MiB | sat_grpo peak MiB | x grpo (memory) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for n in sizes:
        r = objective_check(args.device, n, repeats=1 if args.quick else 20)  # quick: the rows, not the times
        print(json.dumps({"tokens": n, **r}))
        g, s = r["grpo"], r["sat_grpo"]
        mem = (f"{g['peak_mib']:.0f} | {s['peak_mib']:.0f} | {s['peak_mib'] / g['peak_mib']:.2f}"
               if g["peak_mib"] else "- | - | -")  # fmt: skip
        lines.append(f"| {n >> 20 or n >> 10}{'M' if n >= 1 << 20 else 'K'} | {g['ms']:.2f} | {s['ms']:.2f} "
                     f"| {s['ms'] / g['ms']:.2f} | {mem} |")  # fmt: skip
    body = "\n".join(lines)
    print(body)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.md").write_text(f"{time.strftime('%Y-%m-%d')} {args.device}\n\n{body}\n")
    if not args.quick:
        from benchmarks._report import write_section

        write_section("GPU", f"python -m benchmarks.gpu_check --device {args.device}", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
