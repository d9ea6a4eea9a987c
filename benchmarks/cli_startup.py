"""How fast the command line answers (issue 56): ``satrl --version``, ``satrl --help``, every ``satrl CMD --help``
and a config error that needs no model (a misspelt key, a wrong type, an unknown objective name), in CPU seconds
(user + system of the process, from getrusage) and wall seconds, the median of ``--repeats`` runs each.

    python -m benchmarks.cli_startup                 # rewrites docs/benchmarks.md, "Command-line start-up"
    python -m benchmarks.cli_startup --no-write --repeats 3

Each command runs as a user runs it, ``python -m satrl ...`` in a fresh interpreter from the checkout's root. The
targets: under 0.5 s of CPU for the helps and the version, under 1 s for a config error. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("train", "eval", "export", "convert-gguf", "pretrain", "grid", "report", "leaderboard", "demo")  # satrl.cli.COMMANDS

# (what, argv, exit code it must end with)
CASES: list[tuple[str, list[str], int]] = [
    ("`satrl --version`", ["--version"], 0),
    ("`satrl --help`", ["--help"], 0),
    *[(f"`satrl {c} --help`", [c, "--help"], 0) for c in COMMANDS],
    ("config error: misspelt key (`stepz=3`)", ["train", "configs/sat_grpo.yaml", "stepz=3"], 2),
    ("config error: wrong type (`steps=abc`)", ["train", "configs/sat_grpo.yaml", "steps=abc"], 2),
    ("config error: unknown objective (`objective.name=nope`)", ["train", "configs/sat_grpo.yaml",
                                                                 "objective.name=nope"], 2),  # fmt: skip
]


def timed(argv: list[str], want: int) -> tuple[float, float]:
    """(wall s, CPU s) of ``python -m satrl ARGV``; exits if it ends with another code than ``want``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "satrl", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != want:
        sys.exit(f"satrl {' '.join(argv)} exited {proc.returncode}, not {want}: {proc.stderr.strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each command (the median is reported)")
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/benchmarks.md as it is")
    a = p.parse_args(argv)
    rows = [f"| command | CPU s (median of {a.repeats}) | wall s | target |", "| --- | ---: | ---: | ---: |"]
    for what, args, want in CASES:
        runs = [timed(args, want) for _ in range(a.repeats)]
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        target = "< 1 s" if want == 2 else "< 0.5 s"
        rows.append(f"| {what} | {cpu:.2f} | {wall:.2f} | {target} |")
        print(rows[-1], flush=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n".join(rows) + (
        f"\n\nLoad average at the end: {load} (1 / 5 / 15 min). Each command is a fresh `python -m satrl` process; "
        "its CPU s include the interpreter's start. `tests/test_cli_startup.py` fails if the helps, the version or a "
        "config check import torch, transformers, Ray, vLLM, matplotlib, pandas, numpy or safetensors."
    )
    if not a.no_write:
        from benchmarks._report import write_section

        write_section("Command-line start-up", f"python -m benchmarks.cli_startup --repeats {a.repeats}", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
