"""``satrl report runs/NAME``: the command line of the grid report (:mod:`satrl.experiments.report`).

A bad flag, a missing folder or one holding no grid runs is one line and exit 2. Packed results (``--pack``'s output,
as committed under docs/results/) are never rewritten unasked: without ``--out`` the report goes to
``runs/reports/<name>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from satrl.experiments import N_RESAMPLES
from satrl.folders import folder_problem, os_problem

if TYPE_CHECKING:  # the report's modules import numpy, pandas and matplotlib: where used, not for --help
    from satrl.experiments.interaction import Interaction


def add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="grid output folder, e.g. runs/paper_table (or packed results)")
    parser.add_argument("--out", default=None, help="where report.md and figures/ go (default: run_dir; for packed "
                        "results, runs/reports/<name>: a committed folder is rewritten only when --out names it)")
    parser.add_argument("--resamples", type=int, default=N_RESAMPLES,
                        help=f"bootstrap resamples (default {N_RESAMPLES})")
    parser.add_argument("--ci", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument(
        "--pack", default=None, help="also copy summaries/configs/evals/metrics.gz to this folder"
    )
    parser.add_argument(
        "--sensitivity-min-seed", type=int, default=None, metavar="N",
        help="also test the declared hypotheses on seeds >= N only (a sensitivity analysis)",
    )
    parser.add_argument(
        "--sensitivity-seeds", type=seed_range, action="append", default=[], metavar="A-B",
        help="also test the declared hypotheses on seeds A to B (inclusive) only; repeat for several ranges",
    )
    parser.add_argument(
        "--interaction", type=interaction_arg, action="append", default=[], metavar="M,B,LAG,REF[,A-B[,MARGIN]]",
        help="also estimate method M's gain over base B at LAG minus its gain at REF (per seed, sign-flip interval), "
        "on seeds A-B, read against MARGIN points, e.g. opob,grpo,32,0,34-49,2; repeat for several",
    )
    parser.add_argument(
        "--describe", type=describe_arg, default=(), metavar="KEY[,KEY...]",
        help="also a table of each cell's mean of these training metrics over the steps (descriptive), e.g. "
        "obj/opob_shift,train/lr_scale",
    )


def seed_range(text: str) -> tuple[int, int]:
    """``"0-5"`` -> ``(0, 5)``: an inclusive seed range for ``--sensitivity-seeds``."""
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
        raise argparse.ArgumentTypeError(f"expected a seed range A-B with A <= B, e.g. 0-5, got {text!r}")
    return int(lo), int(hi)


def interaction_arg(text: str) -> Interaction:
    """``--interaction``'s value as an :class:`Interaction` (argparse turns the ValueError into one line, exit 2)."""
    from satrl.experiments.interaction import parse_interaction

    try:
        return parse_interaction(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def describe_arg(text: str) -> tuple[str, ...]:
    """``--describe``'s value as metric keys (argparse turns the ValueError into one line, exit 2)."""
    from satrl.experiments.describe import parse_describe

    try:
        return parse_describe(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _bad_flag(args: argparse.Namespace) -> str | None:
    """Why a flag's value cannot be taken (``--ci 1.5``, ``--ci nan``, ``--resamples 0``, ``--out`` or ``--pack``
    naming a file), or None."""
    if not 0 < args.ci < 1:  # NaN fails it too
        return f"--ci {args.ci}: the confidence level must be between 0 and 1 (e.g. 0.95)"
    if args.resamples < 1:
        return f"--resamples {args.resamples}: must be a positive integer (e.g. 10000)"
    for flag in ("out", "pack"):
        if getattr(args, flag) and (why := folder_problem(getattr(args, flag))):
            return f"--{flag} {getattr(args, flag)}: {why}"
    return None


def packed(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds packed results (``--pack``'s output: runs with ``metrics.jsonl.gz`` and no live
    ``metrics.jsonl``), as the folders under docs/results do."""
    logs = [p.name for p in run_dir.glob("*/lag*/seed*/metrics.jsonl*")]
    return "metrics.jsonl.gz" in logs and "metrics.jsonl" not in logs


def run_report(args: argparse.Namespace) -> int:
    from satrl.experiments.describe import DescribeError
    from satrl.experiments.interaction import InteractionError
    from satrl.experiments.report import NoRunsError, build_report
    from satrl.experiments.store import RunFileError

    if why := _bad_flag(args):
        print(f"satrl report: {why}", file=sys.stderr)
        return 2
    if not Path(args.run_dir).is_dir():
        print(f"satrl report: no such folder {args.run_dir}; give a grid's --out folder", file=sys.stderr)
        return 2
    if args.out is None and packed(Path(args.run_dir)):  # a committed results folder: never rewritten unasked
        args.out = Path("runs") / "reports" / Path(args.run_dir).resolve().name
        print(f"satrl report: {args.run_dir} holds packed results: writing to {args.out} (--out {args.run_dir} "
              "regenerates them in place)", file=sys.stderr)  # fmt: skip
    if args.pack:
        from satrl.experiments.store import pack_results

        try:
            pack_results(args.run_dir, args.pack)
        except OSError as err:  # a read-only or full --pack
            print(f"satrl report: cannot write --pack: {os_problem(err, args.pack)}", file=sys.stderr)
            return 2
    extra = ["--sensitivity-min-seed", str(args.sensitivity_min_seed)] if args.sensitivity_min_seed is not None else []
    extra += [a for lo, hi in args.sensitivity_seeds for a in ("--sensitivity-seeds", f"{lo}-{hi}")]
    extra += [a for spec in args.interaction for a in ("--interaction", spec.flag())]
    extra += ["--describe", ",".join(args.describe)] if args.describe else []
    cmd = " ".join(["satrl", "report", str(args.run_dir)] + (["--out", str(args.out)] if args.out else []) + extra)
    try:
        path = build_report(args.run_dir, args.out, n_resamples=args.resamples, ci=args.ci, command=cmd,
                            sensitivity_min_seed=args.sensitivity_min_seed,
                            sensitivity_seeds=tuple(args.sensitivity_seeds),
                            interactions=tuple(args.interaction), describe=args.describe)  # fmt: skip
    except (NoRunsError, InteractionError, DescribeError, RunFileError) as err:
        print(f"satrl report: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a read-only or full --out: no report.md or figure is left half written
        print(f"satrl report: cannot write the report: {os_problem(err, str(args.out or args.run_dir))}",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"wrote {path}")
    return 0
