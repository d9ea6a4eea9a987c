"""Pretraining benchmark: wall time for each built-in recipe to reach the base-policy band.

The band is avg@8 in [0.2, 0.6] (temperature 1, eval split). Each kind trains with the recipe of
``satrl pretrain`` and is scored every ``--eval-every`` steps on ``--eval-problems`` eval problems with the
calibration sampler; the run stops at the first score >= 0.2. Time excludes the periodic scoring. The
table also lists the shipped checkpoints' own record (their ``pretrain.json``).

    .venv/bin/python -m benchmarks.pretrain            # full (minutes on 2 cores)
    .venv/bin/python -m benchmarks.pretrain --quick    # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks._report import write_section
from satrl.models import builtin_path
from satrl.training.pretrain import RECIPES, PretrainSettings, pretrain

BAND = (0.2, 0.6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; does not write the doc")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-problems", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.max_steps, args.eval_every, args.eval_problems = 10, 5, 5

    rows = [
        "| policy | kind | params | steps to avg@8 >= 0.2 | train time (s) | avg@8 there | greedy there "
        "| shipped: steps | shipped: train time (s) | shipped: avg@8 | shipped: greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, recipe in RECIPES.items():
        settings = PretrainSettings(
            kind=recipe["kind"], task=recipe["task"], digits=recipe["digits"], ops=recipe["ops"],
            steps=args.max_steps, seed=0, threads=args.threads, eval_every=args.eval_every,
            eval_problems=args.eval_problems, stop_avg=BAND[0], final_eval_problems=0,
        )  # fmt: skip
        rec = pretrain(settings, progress=False)
        last = next((h for h in reversed(rec["history"]) if "avg_at_k" in h), {})
        reached = last.get("avg_at_k", 0.0) >= BAND[0]
        shipped_file = builtin_path(name) / "pretrain.json"
        shipped = json.loads(shipped_file.read_text()) if shipped_file.is_file() else {}
        final = shipped.get("final", {})
        rows.append(
            f"| {name} | {recipe['kind']} | {rec['params']:,} | {rec['steps_run'] if reached else 'not reached'} "
            f"| {last.get('train_s', float('nan')):.0f} | {last.get('avg_at_k', float('nan')):.3f} "
            f"| {last.get('greedy_acc', float('nan')):.3f} | {shipped.get('steps_run', '-')} "
            f"| {shipped.get('train_time_s', float('nan')):.0f} | {final.get('avg_at_k', float('nan')):.3f} "
            f"| {final.get('greedy_acc', float('nan')):.3f} |"
        )
    body = "\n".join(rows) + (
        f"\n\nBatch 128, AdamW lr 1e-3 betas (0.9, 0.98), {args.threads} torch threads, seed 0. Periodic score: "
        f"avg@8 at temperature 1 on {args.eval_problems} eval problems every {args.eval_every} steps "
        "(satrl.models.sampler); scoring time excluded. Shipped columns: the built-in checkpoints' pretrain.json "
        "(scored with satrl.tasks.evaluate on the torch engine, fp32, 200 eval problems)."
    )
    print(body)
    if not args.quick:
        write_section("Pretraining", "python -m benchmarks.pretrain " + " ".join(argv or sys.argv[1:]), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
