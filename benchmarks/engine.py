"""Engine benchmark: TorchEngine vs HF ``model.generate`` (tokens/s, peak memory), and the implementation
mismatch of each numerics option against the fp32 trainer forward (|d|, MoE routing disagreement).

Run: ``.venv/bin/python -m benchmarks.engine [--quick] [--threads 1]``. Writes the "Engine" section of
docs/benchmarks.md.

Throughput: full-vocabulary sampling at temperature 1 (HF ``top_k=0``), same model copy (the engine's,
so the same numerics), same batch and prompts, in the same process; runs are interleaved and the best of
``reps`` is kept. On CPU the clock is the process CPU time (the machine is shared by other jobs; with one
torch thread CPU time is the work done), on GPU wall time. Workloads: EOS off (exactly ``new`` tokens per
row; HF ``min_new_tokens=new``) and EOS on (tokens up to and including EOS count). Peak memory: on CPU the process RSS sampled
every 1 ms by a thread during the call, minus the RSS just before it; on GPU
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks._report import write_section
from satrl.engines import EngineSpec, TorchEngine
from satrl.models import build_char_tokenizer, build_tiny_model, load_policy
from satrl.models.routing import capture_routing
from satrl.types import GenerationRequest, SamplingParams

NUMERICS = ("fp32", "bf16-weights", "bf16")
BUILTIN = {"dense": "tiny-arith", "moe": "tiny-arith-moe"}


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def peak_memory(fn: Callable[[], object], device: torch.device) -> float:
    """Peak extra memory (MiB) while ``fn`` runs (see module docstring for the method)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    base, peak, done = _rss(), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _rss()) / 2**20 - base / 2**20


def model_and_prompts(kind: str, batch: int, seed: int = 0):
    """The built-in pretrained policy if shipped, else a fresh tiny model; arithmetic prompts."""
    tok = build_char_tokenizer()
    try:
        model, tok = load_policy(BUILTIN[kind])
        source = BUILTIN[kind]
    except ValueError:
        model, source = build_tiny_model(kind, vocab_size=len(tok), seed=seed), f"build_tiny_model('{kind}')"
    g = torch.Generator().manual_seed(seed)
    nums = torch.randint(0, 1000, (batch, 2), generator=g).tolist()
    prompts = [tok(f"{a:03d}+{b:03d}=")["input_ids"] for a, b in nums]
    return model, tok, prompts, source


def _clock(device: torch.device) -> Callable[[], float]:
    """CPU: process CPU time (the machine is shared, and with 1 torch thread CPU time is the work done);
    GPU: wall time after a synchronize."""
    if device.type == "cuda":
        return lambda: (torch.cuda.synchronize(), time.perf_counter())[1]
    return time.process_time


def throughput(
    model, tok, prompts, numerics: str, new: int, reps: int, device: torch.device, eos: bool
) -> dict:
    """Useful tokens per second of the engine and of HF generate on the engine's own model copy.
    eos=False: exactly ``new`` tokens per row. eos=True: rows stop at EOS (the engine drops finished
    rows; HF keeps decoding them until every row is done); tokens counted up to and including EOS."""
    eos_id = tok.eos_token_id if eos else None
    engine = TorchEngine(
        model, EngineSpec(eos_token_id=eos_id, pad_token_id=tok.pad_token_id, numerics=numerics), device=device
    )
    reqs = [GenerationRequest(str(i), p, seed=i) for i, p in enumerate(prompts)]
    sampling = SamplingParams(max_new_tokens=new)
    ids = torch.tensor(prompts, device=device)  # equal-length prompts: no padding for HF either
    hf_kwargs = dict(
        attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=1 if eos else new, do_sample=True,
        temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip

    def run_engine() -> int:
        return sum(len(c.response_ids) for c in engine.generate(reqs, sampling))

    def run_hf() -> int:
        with torch.no_grad():
            out = engine.model.generate(ids, **hf_kwargs)[:, ids.shape[1] :]
        if not eos:
            assert out.shape == (len(prompts), new), out.shape
            return out.numel()
        hit = out == tok.eos_token_id  # tokens up to and including the first EOS
        first = torch.where(
            hit.any(1), hit.int().argmax(1) + 1, torch.full_like(hit[:, 0], out.shape[1], dtype=torch.long)
        )
        return int(first.sum())

    run_engine(), run_hf()  # warm-up
    clock, tps_eng, tps_hf = _clock(device), [], []
    for _ in range(reps):  # interleaved, best of reps
        for fn, tps in ((run_engine, tps_eng), (run_hf, tps_hf)):
            t0 = clock()
            n = fn()
            tps.append(n / (clock() - t0))
    return {
        "engine_tps": max(tps_eng),
        "hf_tps": max(tps_hf),
        "engine_mib": peak_memory(run_engine, device),
        "hf_mib": peak_memory(run_hf, device),
    }


def mismatch(model, tok, prompts, numerics: str, new: int, device: torch.device) -> dict:
    """|d| = |log pi_fp32 - log mu| of sampled tokens (T = 1, full support) and routing disagreement
    (share of (token, MoE layer) pairs whose expert sets differ) vs the fp32 trainer forward."""
    engine = TorchEngine(model, EngineSpec(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, numerics=numerics), device=device)  # fmt: skip
    reqs = [GenerationRequest(str(i), p, seed=10_000 + i) for i, p in enumerate(prompts)]
    comps = engine.generate(reqs, SamplingParams(max_new_tokens=new))
    P = [len(c.prompt_ids) for c in comps]
    L = max(p + len(c.response_ids) for p, c in zip(P, comps))
    ids = torch.full((len(comps), L), tok.pad_token_id, dtype=torch.int64)
    attn = torch.zeros_like(ids)
    for b, c in enumerate(comps):
        row = c.prompt_ids + c.response_ids
        ids[b, : len(row)], attn[b, : len(row)] = torch.tensor(row), 1
    trainer = model.to(device).float().eval()
    moe = comps[0].routing is not None
    with torch.no_grad(), capture_routing(trainer) if moe else nullcontext() as rec:
        logp = torch.log_softmax(
            trainer(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float(), -1
        )
        own = rec.take().cpu() if moe else None
    d, differ, n_pairs = [], 0, 0
    for b, c in enumerate(comps):
        pos = torch.arange(P[b] - 1, P[b] - 1 + len(c.response_ids))
        pi = logp[b, pos.to(device), torch.tensor(c.response_ids, device=device)].cpu()
        d.append(pi - c.behavior_logp)
        if moe:
            e, o = c.routing.sort(-1).values, own[b, pos].sort(-1).values  # engine: at the scoring positions
            differ += int((e != o).any(-1).sum())
            n_pairs += e.shape[0] * e.shape[1]
    d = torch.cat(d).abs().double()
    return {
        "mean_d": float(d.mean()),
        "p90_d": float(d.quantile(0.9)),
        "max_d": float(d.max()),
        "n_tokens": d.numel(),
        "route_disagree": differ / n_pairs if moe else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="tiny smoke run (batch 16, 8 tokens, 1 rep); prints only"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (experiments use 1)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update docs/benchmarks.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch, new, reps = (16, 8, 1) if args.quick else (64, 16, 5)
    mm_batch = 16 if args.quick else 256
    rows, mm_rows, sources = [], [], {}
    for kind in ("dense", "moe"):
        model, tok, prompts, sources[kind] = model_and_prompts(kind, batch)
        _, _, mm_prompts, _ = model_and_prompts(kind, mm_batch, seed=1)
        for numerics, eos in [(n, False) for n in NUMERICS] + [("fp32", True)]:
            r = throughput(model, tok, prompts, numerics, new, reps, device, eos)
            rows.append(
                f"| {kind} | {numerics} | {'on' if eos else 'off'} | {r['engine_tps']:,.0f} | {r['hf_tps']:,.0f} | "
                f"{r['engine_tps'] / r['hf_tps']:.2f}x | {r['engine_mib']:.1f} | {r['hf_mib']:.1f} |"
            )
            print(rows[-1], flush=True)
            if eos:
                continue
            m = mismatch(model, tok, mm_prompts, numerics, new, device)
            rd = "n/a" if kind == "dense" else f"{m['route_disagree']:.4f}"
            mm_rows.append(
                f"| {kind} | {numerics} | {m['mean_d']:.2e} | {m['p90_d']:.2e} | {m['max_d']:.2e} | "
                f"{m['n_tokens']} | {rd} |"
            )
            print(mm_rows[-1], flush=True)
    clock_name = "CPU second of the process" if device.type == "cpu" else "wall-clock second"
    mem = "RSS delta (1 ms sampling)" if device.type == "cpu" else "CUDA max_memory_allocated delta"
    body = "\n".join(
        [
            f"Models: dense = {sources['dense']}, moe = {sources['moe']}. Device {device}, "
            f"{args.threads} torch thread(s).",
            "",
            f"### Throughput: batch {batch}, arithmetic prompts of {len(prompts[0])} tokens, up to {new} new "
            f"tokens per row, temperature 1, full vocabulary; best of {reps} interleaved runs",
            "",
            f"tok/s = generated tokens per {clock_name}. EOS off: every row generates exactly {new} tokens "
            "(HF: min_new_tokens). EOS on: rows stop at EOS and only tokens up to it count; the engine drops "
            "finished rows from the batch, HF decodes them until the last row stops.",
            "",
            "| model | numerics | EOS | engine tok/s | HF generate tok/s | engine/HF | engine peak MiB | HF peak MiB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Peak memory: {mem} during one call, above the memory held before it.",
            "",
            f"### Mismatch vs the fp32 trainer forward: {mm_batch} prompts, up to {new} tokens (EOS on), "
            "temperature 1",
            "",
            "d = log pi_fp32 - log mu per sampled token (mu: the engine, pi: the fp32 trainer forward); routing disagreement = share of (token, MoE layer) "
            "pairs whose expert set differs from the fp32 trainer's own top-k.",
            "",
            "| model | numerics | mean abs d | p90 abs d | max abs d | tokens | routing disagreement |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *mm_rows,
        ]
    )
    print(body)
    if not (args.quick or args.no_write):
        cmd = f"python -m benchmarks.engine --threads {args.threads} --device {device.type}"
        write_section("Engine", cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
