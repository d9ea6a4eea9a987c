"""Rerun a finished run from the config it saved and check that it reproduces: every logged metric of every
optimizer step, and every evaluation, bit for bit (timings aside), on the steps both runs have.

    python -m benchmarks.reproduce docs/results/baselines_trial/grpo/lag0/seed100 --steps 3
    python -m benchmarks.reproduce RUN_DIR --out runs/again      # the whole run again, its checkpoints kept

RUN_DIR is a run's folder, live or packed (`metrics.jsonl` or `metrics.jsonl.gz`, `eval.jsonl`, `config.yaml`,
`environment.json`). The rerun is `satrl train RUN_DIR/config.yaml steps=N out=OUT` with the run's own thread count.
A shorter rerun (``--steps``) moves the late window (the last quarter of its steps), whose evaluations may score more
problems (``eval.late_test_problems``): its evaluations are compared before that window only. Bits depend on the CPU
kind as well as the code (tests/e2e/replay.py): a run recorded on another kind is rerun anyway, with a warning
that its numbers will differ in the last digits and, through sampling, more. Exit 0: reproduced; 1: a difference
(the first one named); 2: bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks._tiny import env, read_stable
from satrl.provenance import read_sessions


def recorded(run: Path) -> tuple[dict, list[dict], list[dict], list[dict]]:
    """The run's config, its metrics and eval rows, and the sessions its environment.json records."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    metrics = read_stable(run / "metrics.jsonl") or read_stable(run / "metrics.jsonl.gz")
    return config, metrics, read_stable(run / "eval.jsonl"), read_sessions(run)


def first_difference(old: list[dict], new: list[dict], what: str, until: int | None) -> str | None:
    """Where ``new`` departs from ``old`` on the steps both have (below ``until``, when given): a row missing or
    a key whose value differs, named with its step. None if they agree."""
    got = {r["step"]: r for r in new}
    steps = [r["step"] for r in old if r["step"] in got and (until is None or r["step"] < until)]
    for row in (r for r in old if r["step"] in steps):
        diff = {k: (row.get(k), got[row["step"]].get(k)) for k in row.keys() | got[row["step"]].keys()
                if row.get(k) != got[row["step"]].get(k)}  # fmt: skip
        if diff:
            key = sorted(diff)[0]
            return f"{what} at step {row['step']}: {key} recorded {diff[key][0]!r}, now {diff[key][1]!r} ({len(diff)} keys differ)"
    return None if steps else f"{what}: no step in common"


def rerun(run: Path, config: dict, steps: int, out: Path) -> None:
    threads = str((config.get("train") or {}).get("max_threads") or (config.get("train") or {}).get("threads") or 1)
    cmd = [sys.executable, "-m", "satrl", "train", str(run / "config.yaml"), f"steps={steps}", f"out={out}", "--no-progress"]
    done = subprocess.run(cmd, env=env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"reproduce: the rerun failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def check(run: Path, steps: int | None, out: Path) -> tuple[int, list[str]]:
    """Rerun ``run`` for ``steps`` (default: all of its own) into ``out`` and compare; (exit code, lines to print)."""
    from satrl.diagnostics.summary import late_window_start
    from satrl.provenance import machine_kind

    config, metrics, evals, sessions = recorded(run)
    total = int(config["steps"])
    steps = total if steps is None else min(steps, total)
    lines = [f"reproduce: {run} recorded on {', '.join(_kind(s.get('cpu')) for s in sessions) or 'an unrecorded machine'} "
             f"at {', '.join(str(s.get('git_commit', '?'))[:8] for s in sessions) or '?'}; here {_kind(machine_kind())}"]
    if sessions and any(s.get("cpu") != machine_kind() for s in sessions):
        lines.append("reproduce: warning: another CPU kind recorded this run; its bits will differ here")
    rerun(run, config, steps, out)
    new_metrics, new_evals = read_stable(out / "metrics.jsonl"), read_stable(out / "eval.jsonl")
    until = None if steps == total else late_window_start(steps)
    why = (first_difference([r for r in metrics if r["step"] <= steps], new_metrics, "metrics", None)
           or first_difference(evals, new_evals, "eval", until))  # fmt: skip
    n_eval = sum(1 for r in evals if r["step"] <= steps and (until is None or r["step"] < until))
    if why:
        return 1, [*lines, f"reproduce: DIFFERS: {why}"]
    return 0, [*lines, f"reproduce: reproduced: {min(steps, len(metrics))} optimizer steps' metrics and {n_eval} "
                       f"evaluation{'' if n_eval == 1 else 's'} bit for bit (timings aside), {steps} of {total} steps "
                       "rerun"]  # fmt: skip


def _kind(cpu: dict | None) -> str:
    return "?" if not cpu else f"{cpu.get('model')} {cpu.get('capability')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished run's folder (live or packed)")
    ap.add_argument("--steps", type=int, help="rerun this many steps only (default: all of the run's)")
    ap.add_argument("--out", type=Path, help="keep the rerun here (default: a temporary folder, removed)")
    a = ap.parse_args(argv)
    if not (a.run / "config.yaml").is_file():
        print(f"reproduce: {a.run}: no config.yaml (give a run's folder)", file=sys.stderr)
        return 2
    if a.steps is not None and a.steps < 1:
        print(f"reproduce: --steps {a.steps}: must be at least 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        code, lines = check(a.run, a.steps, a.out or Path(tmp) / "run")
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
