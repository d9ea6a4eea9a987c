"""Match a fixed-ε trust region's clip fraction to a target's: the repair trial's GSPO ε calibration (stage C).

    python -m benchmarks.clip_calibration 'TARGET_GLOB' EPS_A 'GLOB_A' EPS_B 'GLOB_B'
    python -m benchmarks.clip_calibration --compare 'TARGET_GLOB' 'MATCHED_GLOB'   # did the match hold?

Each GLOB names run folders (``<cell>/lag<n>/seed<s>``, live or packed). A run's clip fraction is the mean over
its logged steps of ``obj/clipfrac``; a group's is the mean over its runs. The two calibration points (ε, clip
fraction) define a line in (ε, log clip fraction); the printed ε is where that line meets the target's clip
fraction, rounded to 0.005 (the rule declared in ``docs/results/repair_trial/protocol.md``, stage C).
``--compare`` reads the runs trained at the matched ε afterwards and prints their clip fraction's relative difference
to the target's, against the protocol's 25 % tolerance.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

from satrl.experiments.store import metrics_path
from satrl.jsonl import read_jsonl


def run_clipfrac(run: Path, key: str = "obj/clipfrac") -> float:
    """Mean of ``key`` over the steps of one run's metrics.jsonl(.gz)."""
    path = metrics_path(run) or run / "metrics.jsonl"
    values = [row[key] for row in read_jsonl(path) if key in row]
    if not values:
        raise ValueError(f"{path}: no {key!r} in any row")
    return sum(values) / len(values)


def group_clipfrac(pattern: str) -> tuple[float, int]:
    """Mean clip fraction over the run folders ``pattern`` matches, and how many there are."""
    runs = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_dir())
    if not runs:
        raise ValueError(f"{pattern}: matches no run folder")
    return sum(map(run_clipfrac, runs)) / len(runs), len(runs)


def matched_eps(a: tuple[float, float], b: tuple[float, float], target: float, step: float = 0.005) -> float:
    """ε where the line through points a = (ε_a, f_a) and b = (ε_b, f_b) in (ε, log f) reaches log target:
    ε = ε_a + (log target − log f_a) · (ε_b − ε_a) / (log f_b − log f_a), rounded to a multiple of ``step``."""
    (ea, fa), (eb, fb) = a, b
    if min(fa, fb, target) <= 0 or fa == fb:
        raise ValueError(f"clip fractions must be positive and differ: {fa}, {fb}, target {target}")
    eps = ea + (math.log(target) - math.log(fa)) * (eb - ea) / (math.log(fb) - math.log(fa))
    return round(round(eps / step) * step, 10)


TOLERANCE = 0.25  # the protocol's: beyond it the findings say the match did not hold


def _runs(n: int) -> str:
    return f"{n} run" + "s" * (n != 1)


def compare(target: str, matched: str) -> str:
    """One line: both groups' clip fractions, the relative difference (matched − target) / target, and whether it
    is within the protocol's tolerance."""
    t, n_t = group_clipfrac(target)
    m, n_m = group_clipfrac(matched)
    rel = (m - t) / t
    held = "within" if abs(rel) <= TOLERANCE else "beyond"
    return (f"target {t:.5f} ({_runs(n_t)}); matched {m:.5f} ({_runs(n_m)}); relative difference {rel:+.1%}, "
            f"{held} the {TOLERANCE:.0%} tolerance")


def calibrate(args: argparse.Namespace) -> str:
    """The calibration's three lines: the target's clip fraction, the two points', and the matched ε."""
    target, n_t = group_clipfrac(args.target)
    fa, n_a = group_clipfrac(args.runs_a)
    fb, n_b = group_clipfrac(args.runs_b)
    eps = matched_eps((args.eps_a, fa), (args.eps_b, fb), target)
    return (f"target clip fraction {target:.5f} ({n_t} runs)\n"
            f"eps {args.eps_a:g}: {fa:.5f} ({n_a} runs); eps {args.eps_b:g}: {fb:.5f} ({n_b} runs)\n"
            f"matched eps {eps:.3f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", help="run folders whose clip fraction is matched (a glob)")
    p.add_argument("eps_a", type=float)
    p.add_argument("runs_a", help="run folders trained at eps_a (a glob)")
    p.add_argument("eps_b", type=float)
    p.add_argument("runs_b", help="run folders trained at eps_b (a glob)")
    try:
        if argv[:1] == ["--compare"]:
            if len(argv) != 3:
                raise ValueError("--compare takes two globs: TARGET_GLOB MATCHED_GLOB")
            out = compare(argv[1], argv[2])
        else:
            out = calibrate(p.parse_args(argv))
    except (ValueError, OSError, KeyError) as e:
        print(f"clip_calibration: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
