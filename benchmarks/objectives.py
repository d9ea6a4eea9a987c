"""Objective benchmark: forward+backward time and peak memory of the policy losses.

    .venv/bin/python -m benchmarks.objectives            # 4K (a shipped microbatch), 1M, 4M + sat_grpo at 64M
    .venv/bin/python -m benchmarks.objectives --quick    # tiny smoke run (not written to the docs)
    .venv/bin/python -m benchmarks.objectives --sizes 4K 1M 4M --no-64m --threads 2 --repeats 15

Shapes: B = N/1024 responses of T = 1024 tokens, all active; adv is [B]; no ``ref_logp`` (the KL term is
skipped, so the numbers are the policy terms alone). One step = ``policy_loss`` + ``aggregate``
(token-mean) + ``backward``, metrics included. SAT has one implementation (``satrl.objectives.sat``), the
same on every device. The last line is SAT's share of a training step: one trainer step of the tiny policy
on a fixed batch, ``grpo`` and ``sat_grpo`` interleaved (``benchmarks.pipeline.sat_step_ratio``).

verl rows (when verl is importable): ``verl:vanilla`` and ``verl:gspo``, verl's own policy-loss functions
called as its actor calls them (``ActorConfig`` with radii 0.2/0.2, a bool [B, T] response mask, a
materialized [B, T] advantage, ``loss_agg_mode="token-mean"``), then ``backward``; their metrics are
Python floats (``.item()``), as verl returns them. verl's vanilla includes its dual clip (c = 3). For
their peak memory, verl is imported and the [B, T] advantage built before the measurement starts.
Paired ratios: for each pair (a, b), the median of time(a) / time(b) over adjacent runs in alternating
order, the number to trust on a shared machine.

Time: median over repeats, all rows interleaved in one process (A, B, A, B, ...), so a noisy neighbour
slows every row alike; ratios are to ``grpo`` at that size.
Allocator: glibc's malloc adapts its mmap and trim thresholds to the sizes it has seen, so whether a step's
[B, T] buffers come from already-mapped heap pages or from fresh ones (a minor page fault, and the kernel
zeroing the page, per 4 KiB) depends on what ran before it, not on the objective. At 4M tokens the swing this
causes in one row is about as large as SAT's whole extra time (run with ``--glibc-default`` and compare the
fault counts and times). The timing process therefore pins the two thresholds (``mallopt``: mmap threshold
32 MiB, trim threshold 1 GiB), which makes every row fault-free after its warm-up; ``--glibc-default``
leaves them to glibc. The paired lines print the faults per step either way.
Peak memory: each (preset, size) runs in a fresh subprocess with ``MALLOC_MMAP_THRESHOLD_=65536`` (so
every large tensor is its own mmap, returned to the OS when freed); after building the inputs it resets
the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``) and reports VmHWM - VmRSS after one
step: the peak extra resident memory of the step, over the inputs. (tracemalloc does not see torch's
allocations, which is why RSS is used.)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from satrl.objectives import aggregate, policy_loss

PRESETS = ["grpo", "sat_grpo", "gspo", "sat_gspo", "dppo_tv"]
VERL_ROWS = ["verl:vanilla", "verl:gspo"]
T = 1024


def rows_available() -> list[str]:
    """Our presets, and verl's rows when verl imports."""
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except ImportError:
        return list(PRESETS)
    return [*PRESETS, *VERL_ROWS]


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KM" else s) * mult)


def fmt_size(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def make_inputs(n_tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = max(1, n_tokens // T)
    t = min(T, n_tokens)
    logp = -torch.rand(b, t, generator=g) * 3.0
    blp = logp + 0.05 * torch.randn(b, t, generator=g)
    return {
        "logp": logp.requires_grad_(),
        "behavior_logp": blp,
        "adv": torch.randn(b, generator=g),
        "mask": torch.ones(b, t, dtype=torch.bool),
    }


_VERL: dict = {}


def _verl_call(name: str, x: dict[str, torch.Tensor]) -> torch.Tensor:
    """verl's policy loss ``name`` on the same tokens, with the inputs its actor would pass."""
    if not _VERL:
        from verl.trainer.ppo import core_algos
        from verl.workers.config import ActorConfig

        _VERL["fns"] = core_algos.get_policy_loss_fn
        _VERL["config"] = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2,
                                      clip_ratio_low=0.2, clip_ratio_high=0.2)  # fmt: skip
    if "adv_bt" not in x:  # verl's batch holds a [B, T] advantage
        x["adv_bt"] = x["adv"][:, None].expand_as(x["mask"]).contiguous()
    loss, _ = _VERL["fns"](name)(x["behavior_logp"], x["logp"], x["adv_bt"], x["mask"],
                                 loss_agg_mode="token-mean", config=_VERL["config"])  # fmt: skip
    return loss


def step(preset: str, x: dict[str, torch.Tensor]) -> None:
    x["logp"].grad = None
    if preset.startswith("verl:"):
        _verl_call(preset.split(":", 1)[1], x).backward()
        return
    ours = {k: v for k, v in x.items() if k != "adv_bt"}
    aggregate(policy_loss(preset, **ours).loss, x["mask"], "token-mean").backward()


def time_presets(n_tokens: int, repeats: int, presets: list[str] | None = None) -> dict[str, float]:
    presets = rows_available() if presets is None else presets
    x = make_inputs(n_tokens)
    for p in presets:  # warm-up
        step(p, x)
    runs: dict[str, list[float]] = {p: [] for p in presets}
    for _ in range(repeats):
        for p in presets:
            t0 = time.perf_counter()
            step(p, x)
            runs[p].append(time.perf_counter() - t0)
    return {p: statistics.median(v) for p, v in runs.items()}


PAIRS = [("sat_grpo", "grpo"), ("sat_grpo", "verl:vanilla"), ("gspo", "verl:gspo"), ("sat_gspo", "gspo")]


def paired_ratios(n_tokens: int, repeats: int, presets: list[str]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(time(a) / time(b), a's and b's minor page faults per step) for each pair in :data:`PAIRS`: the
    ratio is the median over ``repeats`` adjacent (a, b) runs, the order alternating (ab, ba, ab, ...),
    so that load that changes over seconds on a shared machine cancels within each pair. The faults
    (pages the allocator had to map afresh) are medians too: they are part of each step's time."""
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    x = make_inputs(n_tokens)
    out = {}
    for a, b in PAIRS:
        if a not in presets or b not in presets:
            continue
        step(a, x), step(b, x)  # warm-up
        ratios, flt = [], {a: [], b: []}
        for i in range(repeats):
            times = {}
            for p in ((a, b) if i % 2 == 0 else (b, a)):
                f0, t0 = faults(), time.perf_counter()
                step(p, x)
                times[p] = time.perf_counter() - t0
                flt[p].append(faults() - f0)
            ratios.append(times[a] / times[b])
        out[(a, b)] = (statistics.median(ratios), statistics.median(flt[a]), statistics.median(flt[b]))
    return out


def _pairs_text(pairs: dict) -> str:
    return ("minor page faults per step in brackets): "
            + "; ".join(f"{a} / {b} = {r:.2f} ({fa:.0f} / {fb:.0f})" for (a, b), (r, fa, fb) in pairs.items()) + ".")


def _median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def step_share_line(repeats: int) -> str:
    """SAT's share of a trainer step (tiny policy, fixed batch, 1 thread): (sat_grpo - grpo) / sat_grpo."""
    from benchmarks.pipeline import sat_step_ratio

    r = sat_step_ratio(repeats)
    share = (r["sat_grpo_s"] - r["grpo_s"]) / r["sat_grpo_s"]
    return (f"SAT's share of a training step (`benchmarks.pipeline.sat_step_ratio`, {repeats} interleaved repeats): "
            f"grpo {r['grpo_s'] * 1e3:.1f} ms, sat_grpo {r['sat_grpo_s'] * 1e3:.1f} ms, ratio {r['ratio']:.3f}, "
            f"share {share:.1%}.")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def steady_allocator() -> bool:
    """Pin glibc's mmap threshold (32 MiB, its largest) and trim threshold (1 GiB) in this process, so freed
    [B, T] buffers stay mapped and are reused (see the module docstring). False where the C library is not
    glibc (then nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure_child(preset: str, n_tokens: int, demo_quantile: bool) -> dict:
    """Runs inside the fresh subprocess: one step, its time and its peak extra RSS."""
    x = make_inputs(n_tokens)
    out: dict = {}
    if preset.startswith("verl:"):  # import verl and build its [B, T] advantage before measuring
        x["logp"].requires_grad_(False)
        _verl_call(preset.split(":", 1)[1], x)
        x["logp"].requires_grad_(True)
    if demo_quantile:
        d = (x["logp"].detach() - x["behavior_logp"]).abs().flatten()
        try:
            torch.quantile(d, 0.9)
            out["quantile"] = "ran"
        except RuntimeError as e:
            out["quantile"] = f"RuntimeError: {str(e).splitlines()[0]}"
        del d
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    t0 = time.perf_counter()
    step(preset, x)
    out["time_s"] = time.perf_counter() - t0
    out["peak_bytes"] = _status("VmHWM") - before
    out["input_bytes"] = sum(t.numel() * t.element_size() for k, t in x.items() if k != "adv_bt")
    return out


def peak_memory(preset: str, n_tokens: int, demo_quantile: bool = False) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, "-m", "benchmarks.objectives", "--_child", preset, str(n_tokens),
           "--threads", str(torch.get_num_threads())]  # fmt: skip
    if demo_quantile:
        cmd.append("--_quantile")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, nothing written to docs")
    ap.add_argument("--sizes", nargs="+", default=None, help="active-token counts, e.g. 1M 4M 16M")
    ap.add_argument("--no-64m", action="store_true", help="skip the 64M sat_grpo run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable on a shared box)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per size (default: by size)")
    ap.add_argument("--glibc-default", action="store_true",
                    help="leave glibc's malloc thresholds as they are (default: pin them, see the docstring)")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_paired_child", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_quantile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args._child:
        print(json.dumps(measure_child(args._child[0], int(args._child[1]), args._quantile)))
        return 0
    if args._paired_child:  # thresholds left to glibc
        n, reps = args._paired_child
        print(json.dumps({f"{a} / {b}": v for (a, b), v in paired_ratios(n, reps, rows_available()).items()}))
        return 0

    pinned = False if args.glibc_default else steady_allocator()
    sizes = [parse_size(s) for s in (args.sizes or (["4K", "64K"] if args.quick else ["4K", "1M", "4M"]))]
    rows = []
    presets = rows_available()
    for n in sizes:
        repeats = args.repeats or (3 if args.quick else max(3, min(15, (8 << 20) // n)))
        times = time_presets(n, repeats, presets)
        for p in presets:
            mem = peak_memory(p, n)
            rows.append((n, p, times[p], mem["peak_bytes"], repeats))
    mem_of = {(n, p): m for n, p, _, m, _ in rows}
    time_of = {(n, p): t for n, p, t, _, _ in rows}
    lines = [
        "| tokens | preset | fwd+bwd ms | x grpo (time) | peak extra MiB | x grpo (memory) | repeats |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, p, t, m, r in rows:
        lines.append(
            f"| {fmt_size(n)} | {p} | {t * 1e3:.1f} | {t / time_of[(n, 'grpo')]:.2f} | {m / 2**20:.0f} "
            f"| {m / mem_of[(n, 'grpo')]:.2f} | {r} |"
        )
    body = "\n".join(lines)
    reps = args.repeats or (3 if args.quick else 15)
    for n in sizes:
        pairs = paired_ratios(n, reps, presets)
        if pairs:
            body += f"\n\nPaired time ratios at {fmt_size(n)} (median over {reps} adjacent runs, order alternating; " + _pairs_text(pairs)
    if pinned:  # the same at the largest size in a fresh process whose malloc thresholds glibc adapts
        res = subprocess.run([sys.executable, "-m", "benchmarks.objectives", "--_paired_child", str(max(sizes)), str(reps),
                              "--threads", str(torch.get_num_threads())], capture_output=True, text=True, check=True)  # fmt: skip
        pairs = {tuple(k.split(" / ")): tuple(v) for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}
        body += (f"\n\nThe same at {fmt_size(max(sizes))} in a fresh process with glibc's malloc thresholds left to "
                 f"glibc (`--glibc-default`; median over {reps}; " + _pairs_text(pairs))  # fmt: skip
    if not args.quick and not args.no_64m:
        big = 64 << 20
        r = peak_memory("sat_grpo", big, demo_quantile=True)
        body += (
            f"\n\nsat_grpo at {fmt_size(big)} tokens: one step {r['time_s']:.1f} s, peak extra "
            f"{r['peak_bytes'] / 2**30:.2f} GiB (inputs {r['input_bytes'] / 2**30:.2f} GiB). "
            f"`torch.quantile` on the same {fmt_size(big)} |d| values: {r['quantile']}."
        )
    body += "\n\n" + step_share_line(4 if args.quick else 40)
    note = (
        f"\n\nTime: median of the repeats, rows interleaved in one process, {torch.get_num_threads()} "
        f"torch thread(s), glibc's malloc thresholds {'pinned (see the script)' if pinned else 'left to glibc'}. "
        "Memory: peak extra RSS of one step in a fresh subprocess (see the script's "
        "docstring). B = N/1024 responses of 1024 tokens, all active, adv [B], no ref_logp (no KL term). "
        "The table's x-grpo column compares rows that each ran between six other presets, which leaves a "
        "different cache and allocator state than a training loop (one objective, call after call) does; "
        "the paired ratios come closer to that loop and are the numbers to hold to a target."
    )
    body += note
    load = os.getloadavg()
    body += (f" Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) on "
             f"{os.cpu_count()} cores; above ~{max(os.cpu_count() - 1, 1)} the machine was shared and the "
             "timings (more so the multi-thread ones) are noisy.")  # fmt: skip
    print(body)
    if not args.quick:
        from benchmarks._report import write_section

        cmd = "python -m benchmarks.objectives" + (f" --sizes {' '.join(args.sizes)}" if args.sizes else "")
        cmd += (" --no-64m" if args.no_64m else "") + (f" --threads {args.threads}" if args.threads != 1 else "")
        cmd += f" --repeats {args.repeats}" if args.repeats else ""
        cmd += " --glibc-default" if args.glibc_default else ""
        write_section("Objectives", cmd, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
