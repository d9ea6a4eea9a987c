"""A measured run of a real model (docs/real-models.md, "A measured run"): watch its memory, then record it.

    python -m benchmarks.real_run watch RSS.json -- satrl train configs/real/smollm2_arith.yaml out=runs/smollm2
    python -m benchmarks.real_run record runs/smollm2 --rss RSS.json --engine torch --out docs/results/real_models/X.json
    python -m benchmarks.real_run table docs/results/real_models/X.json      # the markdown the docs quote

``watch`` runs the command and samples the resident memory (VmRSS) of it and every process below it once a
second: the peak of each process (the trainer, the engine process, evaluation) and the peak of their sum.
``record`` keeps, from the run's own logs, what the docs quote: the held-out scores at every evaluation
(``eval.jsonl``), the reward of every step and the seconds a step spends generating and training
(``metrics.jsonl``), so the docs' numbers are checked against a small JSON file rather than a run folder
(tests/test_real_run.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread ended while we read
            pass
    return kids


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def watch(cmd: list[str], every_s: float = 1.0) -> dict:
    """Run ``cmd``, sampling the RSS of its process tree; return its exit code and the peaks in MB."""
    proc = subprocess.Popen(cmd)
    peak_sum, peak_one, start = 0.0, 0.0, time.time()
    while proc.poll() is None:
        rss = [_rss_mb(p) for p in _tree(proc.pid)]
        peak_sum, peak_one = max(peak_sum, sum(rss)), max(peak_one, max(rss, default=0.0))
        time.sleep(every_s)
    return {"command": " ".join(cmd), "rc": proc.returncode, "wall_s": round(time.time() - start, 1),
            "peak_rss_sum_mb": round(peak_sum), "peak_rss_process_mb": round(peak_one)}  # fmt: skip


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record(run: Path, engine: str, rss: dict | None = None) -> dict:
    """What the docs quote of ``run``: evaluations, per-step reward and the split of a step's time. A run that
    stopped early (killed) keeps what it logged: its steps and evaluations so far, ``rc`` from ``watch``."""
    metrics = _jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    evals = _jsonl(run / "eval.jsonl") if (run / "eval.jsonl").exists() else []
    busy = [m["perf/engine_busy_s"] for m in metrics]
    steps = [{"step": m["step"], "reward": round(m["train/reward"], 4), "wait_s": round(m["perf/trainer_wait_s"], 2),
              "generate_s": round(b - a, 2), "train_s": round(m["train/tokens"] / m["perf/trainer_tok_s"], 2),
              "wall_s": round(m["wall_s"], 1)}
             for m, a, b in zip(metrics, [0.0] + busy, busy)]  # fmt: skip
    keep = ("step", "test_avg_at_k", "test_greedy_acc", "test_pass_at_k", "test_n", "prompt_tokens")
    median = lambda key: round(statistics.median(s[key] for s in steps), 1) if steps else None  # noqa: E731
    return {"engine": engine, "steps": steps, "evals": [{k: e[k] for k in keep if k in e} for e in evals],
            "median_generate_s": median("generate_s"), "median_train_s": median("train_s"),
            "memory": _peaks(rss)}  # fmt: skip


def _peaks(rss: dict | None) -> dict | None:
    """The peaks of ``watch``'s file, without its command line (it names this machine's interpreter)."""
    return None if rss is None else {k: rss[k] for k in ("rc", "peak_rss_sum_mb", "peak_rss_process_mb", "wall_s")}


def table(rec: dict, every: int = 5) -> str:
    """The markdown tables of a record: its evaluations, then every ``every``-th step's reward and time."""
    lines = []
    if rec["evals"]:
        lines += ["| step | held-out avg@k | greedy | pass@k |", "| ---: | ---: | ---: | ---: |"]
        for e in rec["evals"]:
            cells = [f"{100 * e[k]:.1f} %" for k in ("test_avg_at_k", "test_greedy_acc", "test_pass_at_k")]
            lines.append(f"| {e['step']} | " + " | ".join(cells) + " |")
    if rec["steps"]:
        lines += ["", "| steps | mean reward | generation s/step | training s/step |", "| --- | ---: | ---: | ---: |"]
        for i in range(0, len(rec["steps"]), every):
            part = rec["steps"][i : i + every]
            reward, gen, train = (sum(s[key] for s in part) / len(part) for key in ("reward", "generate_s", "train_s"))
            lines.append(f"| {part[0]['step']}-{part[-1]['step']} | {reward:.3f} | {gen:.1f} | {train:.1f} |")
    return "\n".join(lines).strip("\n")


def row(rec: dict) -> str:
    """docs/benchmarks.md's row of a record: steps trained, the first held-out score, a step's time, memory."""
    first, mem = (rec["evals"] or [{}])[0], rec["memory"] or {}
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    score = "-" if "test_avg_at_k" not in first else f"{100 * first['test_avg_at_k']:.1f} % (step {first['step']})"
    return (f"| {rec['engine']} | {len(rec['steps'])} | {score} | {num(rec['median_generate_s'], '.1f')} | "
            f"{num(rec['median_train_s'], '.1f')} | {num(mem.get('wall_s'), '.0f')} | "
            f"{num(mem.get('peak_rss_sum_mb'), ',')} | {num(mem.get('rc'), 'd')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.real_run", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch")
    w.add_argument("out")
    w.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("record")
    r.add_argument("run")
    r.add_argument("--rss")
    r.add_argument("--engine", required=True)
    r.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("record")
    args = ap.parse_args(argv)
    if args.cmd == "watch":
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        result = watch(cmd)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return result["rc"]
    if args.cmd == "record":
        rss = json.loads(Path(args.rss).read_text()) if args.rss else None
        Path(args.out).write_text(json.dumps(record(Path(args.run), args.engine, rss), indent=1) + "\n")
        return 0
    rec = json.loads(Path(args.record).read_text())
    print(table(rec) + "\n\n" + row(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
