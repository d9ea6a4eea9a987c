"""CI's time (issue 56): `.ci/run`'s targets, in its order, on fresh clean clones of this checkout's HEAD, each target's
wall and CPU seconds (user + system of every process it starts, from getrusage) and pytest's summary line, with
the load average and the pip cache's state; the median over ``--runs`` clones.

    python -m benchmarks.ci_time                  # 2 clean clones, one after the other; rewrites "CI time"
    python -m benchmarks.ci_time --runs 1 --no-write
    python -m benchmarks.ci_time --logs ci-logs     # keeps each target's log, its 25 slowest tests among it

A clean clone builds every environment from nothing (`.venv`, `.venv-core`, `.venv-verl`, `.venv-vllm`), as CI does;
pip's download cache is shared, as on the CI machine. Run it on a quiet machine: about half an hour a clone.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("test", "test-core", "test-verl", "test-vllm")  # .ci/run's `make` calls, in its order
SUMMARY = re.compile(r"^=+ (.*(?:passed|failed|error).* in [\d.]+s)", re.M)  # pytest's last line, per call


def ci_targets(script: str) -> tuple[str, ...]:
    """The make targets `.ci/run` calls, in order."""
    return tuple(re.findall(r"^make ([\w-]+)\s*$", script, re.M))


def pip_cache() -> str:
    """The pip cache's size, as `pip cache info` says (``?`` where pip cannot tell)."""
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "info"], capture_output=True, text=True)
    size = re.search(r"Package index page cache size: (.+)", out.stdout)
    wheels = re.search(r"Locally built wheels size: (.+)", out.stdout)
    return f"index pages {size.group(1).strip() if size else '?'}, built wheels {wheels.group(1).strip() if wheels else '?'}"


def run_target(clone: Path, target: str, log: Path) -> dict:
    """Run ``make TARGET`` in ``clone``; its wall and CPU seconds, exit code and pytest summaries."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(["make", target], cwd=clone, stdout=f, stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).returncode  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "rc": rc, "summary": "; ".join(SUMMARY.findall(log.read_text()))}


def one_clone(work: Path, i: int) -> tuple[dict[str, dict], str]:
    """Every target on a fresh clone; the results and the load average when it started."""
    clone = work / f"clone{i}"
    subprocess.run(["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    results = {}
    for target in TARGETS:
        results[target] = run_target(clone, target, work / f"clone{i}-{target}.log")
        r = results[target]
        print(f"clone {i}: make {target}: {r['wall']:.0f} s wall, {r['cpu']:.0f} s CPU, exit {r['rc']}; {r['summary']}",
              flush=True)  # fmt: skip
    return results, load


def table(runs: list[dict[str, dict]]) -> list[str]:
    n = len(runs)
    head = " | ".join(f"clone {i + 1} wall s" for i in range(n))
    rows = [f"| target | {head} | median wall s | median CPU s | pytest (clone 1) |",
            "| --- |" + " ---: |" * (n + 2) + " --- |"]  # fmt: skip
    for target in [*TARGETS, "all"]:
        per = [sum(r[t]["wall"] for t in TARGETS) if target == "all" else r[target]["wall"] for r in runs]
        cpu = [sum(r[t]["cpu"] for t in TARGETS) if target == "all" else r[target]["cpu"] for r in runs]
        summary = "" if target == "all" else runs[0][target]["summary"]
        name = "`.ci/run` (all four)" if target == "all" else f"`make {target}`"
        rows.append(f"| {name} | " + " | ".join(f"{w:.0f}" for w in per)
                    + f" | {statistics.median(per):.0f} | {statistics.median(cpu):.0f} | {summary} |")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="clean clones, timed one after the other (median reported)")
    p.add_argument("--no-write", action="store_true", help="print the table; leave docs/benchmarks.md as it is")
    p.add_argument("--logs", type=Path, help="keep each target's log (its 25 slowest tests among it) in this folder")
    a = p.parse_args(argv)
    if ci_targets((ROOT / ".ci" / "run").read_text()) != TARGETS:
        sys.exit(f".ci/run's targets are {ci_targets((ROOT / '.ci' / 'run').read_text())}, not {TARGETS}: update TARGETS")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    cache = pip_cache()
    runs, loads = [], []
    with tempfile.TemporaryDirectory(prefix="satrl-ci-") as tmp:
        for i in range(a.runs):
            results, load = one_clone(Path(tmp), i + 1)
            if a.logs:  # the clone's folder goes with the temporary one; its logs say where the time went
                a.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob(f"clone{i + 1}-*.log"):
                    shutil.copy(log, a.logs / log.name)
            shutil.rmtree(Path(tmp) / f"clone{i + 1}", ignore_errors=True)  # ~12 GB each: not two on the disk at once
            runs.append(results)
            loads.append(load)
            failed = report(runs, loads, commit.strip(), cache, write=not a.no_write)  # after each clone: none lost
    return 1 if failed else 0


def report(runs: list[dict[str, dict]], loads: list[str], commit: str, cache: str, write: bool) -> list[str]:
    """Print (and unless a target failed, write) the section for the clones so far; the targets that failed."""
    failed = [f"clone {i + 1} make {t}" for i, r in enumerate(runs) for t in TARGETS if r[t]["rc"] != 0]
    end = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    body = "\n".join(table(runs)) + (
        f"\n\nCommit {commit}. Load average (1 / 5 / 15 min) at each clone's start: {'; '.join(loads)}; at the "
        f"end: {end}. pip's cache before the first clone: {cache} (wheels of this machine's local index need no "
        "download either way). Each clone builds its four environments from nothing, so each target's time includes "
        "its environment's install. " + (f"FAILED: {', '.join(failed)}." if failed else "Every target passed.")
    )
    if write and not failed:
        from benchmarks._report import write_section

        write_section("CI time", f"python -m benchmarks.ci_time --runs {len(runs)}", body)
    print(body, flush=True)
    return failed

if __name__ == "__main__":
    raise SystemExit(main())
