"""What the front page's commands cost: `satrl demo` (GRPO, SAT-GRPO and VCPO side by side, 50 steps each) and one
600-step run of the repair trial's regime per method (configs/regimes/repair_trial.yaml, the README's "What to turn
on"), in wall time and CPU time (user + system of every process the command starts, from getrusage).

    python -m benchmarks.demo_cost            # the demo and the regime's VCPO and GRPO runs; rewrites "Demo"
    python -m benchmarks.demo_cost --demo-only --no-write

Run it on a quiet machine (no grid beside it): the load average at the end is printed with the table. README.md
quotes the demo's CPU and wall seconds and the regime's minutes; tests/test_readme_front.py keeps them equal.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REGIME = "configs/regimes/repair_trial.yaml"
ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and all its descendants) of one command run to completion; exits if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo-only", action="store_true", help="time the demo alone")
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/benchmarks.md as it is")
    a = p.parse_args(argv)
    satrl = [sys.executable, "-m", "satrl"]
    rows = ["| command | wall s | CPU s |", "| --- | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = timed([*satrl, "demo", "--out", f"{tmp}/demo"])
        rows.append(f"| `satrl demo` (3 runs of 50 steps side by side, report) | {wall:.0f} | {cpu:.0f} |")
        print(rows[-1], flush=True)
        for method in () if a.demo_only else ("vcpo", "grpo"):
            over = [f"objective.name={method}"] if method != "grpo" else []
            wall, cpu = timed([*satrl, "train", REGIME, *over, f"out={tmp}/{method}"])
            rows.append(f"| `{' '.join(['satrl train', REGIME, *over])}` (600 steps) | {wall:.0f} | {cpu:.0f} |")
            print(rows[-1], flush=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n".join(rows) + (
        f"\n\nLoad average at the end: {load} (1 / 5 / 15 min). The demo runs its three trainers and three engine "
        "processes at once, one thread each; the regime's runs use one thread (`train.threads=1`, sequential "
        "backend). CPU s counts every process a command starts, imports included."
    )
    if not a.no_write:
        from benchmarks._report import write_section

        write_section("Demo", " ".join(["python -m benchmarks.demo_cost", *(argv or sys.argv[1:])]), body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
