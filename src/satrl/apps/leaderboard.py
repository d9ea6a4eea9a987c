"""``satrl leaderboard SPEC.yaml``: one leaderboard across testbeds (:mod:`satrl.experiments.across`).

Writes ``leaderboard.md`` and ``figures/leaderboard.png`` to ``--out`` (default: the spec's folder) and prints
``wrote <path>``. A bad flag, a missing or invalid spec, a results folder that does not exist, a base without runs
at its lags or a method run on no testbed is one line naming the file and the field, and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from satrl.experiments import N_RESAMPLES
from satrl.folders import folder_problem, os_problem


def add_leaderboard_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the leaderboard spec, e.g. docs/results/leaderboard.yaml")
    parser.add_argument(
        "--out", default=None, help="where leaderboard.md and figures/ go (default: the spec's folder)"
    )
    parser.add_argument("--resamples", type=int, default=N_RESAMPLES,
                        help=f"bootstrap resamples of the repaired fraction (default {N_RESAMPLES})")  # fmt: skip


def run_leaderboard(args: argparse.Namespace) -> int:
    why = None
    if args.resamples < 1:
        why = f"--resamples {args.resamples}: must be a positive integer (e.g. {N_RESAMPLES})"
    elif args.out and (problem := folder_problem(args.out)):
        why = f"--out {args.out}: {problem}"
    if why is None:
        from satrl.experiments.across import build_leaderboard  # numpy, pandas and matplotlib: not for --help

        try:
            path = build_leaderboard(args.spec, args.out, n_resamples=args.resamples)
        except ValueError as err:  # ConfigError included: the spec, its folders or its runs
            why = " ".join(str(err).split())
        except OSError as err:  # a read-only or full --out: no page or figure is left half written
            why = f"cannot write the leaderboard: {os_problem(err, str(args.out or Path(args.spec).parent))}"
    if why is not None:
        print(f"satrl leaderboard: {why}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
