"""``satrl grid GRID.yaml``: the command line of the grid runner (:mod:`satrl.experiments.grid`).

A bad flag, grid file or ``--out``, a grid changed since its runs in ``--out`` were made, another grid running into
``--out``, a protocol not committed, or a run's config that ``satrl train`` would refuse is one line and exit 2,
before any run starts; ``--dry-run`` prints each run's command and state (and why a config would be refused).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from satrl.folders import folder_problem, os_problem


def add_grid_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grid", help="grid YAML, e.g. configs/grids/paper_table.yaml")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per cell and lag (default: the grid's)"
    )
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (threads split across them)")
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per run (default: cores // workers)"
    )
    parser.add_argument("--out", default=None, help="output folder (default: runs/<grid name>)")
    parser.add_argument(
        "--only", action="extend", nargs="+", default=None, metavar="PATTERN",
        help="run only runs whose name <cell>/lag<n>/seed<s> matches one of these shell patterns (several per "
        "--only, or repeat it), e.g. --only 'grpo_lr5e-5/*' '*/lag8/seed[12]'",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print each run's command and state, run nothing"
    )
    parser.add_argument(
        "--rerun-changed", action="store_true",
        help="runs in --out made with other settings than the grid's now are moved to --out/.replaced/ and run "
        "again (without it, such a rerun stops with what changed)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-commit-change", action="store_true",
        help="a grid naming a protocol: continue on another code commit than its earlier runs' (say why in the "
        "protocol; by default a pre-registered grid runs on one commit, from a pinned worktree)",
    )  # fmt: skip


def _bad_flag(args: argparse.Namespace) -> str | None:
    """Why a counting flag cannot be taken (``--seeds 0`` ran the grid's count, ``--seeds -2`` said "--only
    matches no run"), or None."""
    for flag in ("seeds", "workers", "threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            return f"--{flag} {value}: must be a positive integer"
    return None


def run_grid(args: argparse.Namespace) -> int:
    # here, not at the top: `satrl grid --help` imports no experiment code (the config check it reaches is heavy)
    from satrl.experiments.changes import GridChangedError, changed_runs, guard_changes
    from satrl.experiments.grid import (
        GridBusyError,
        GridConfigError,
        config_problems,
        default_command,
        run_grid_spec,
        thread_capped,
    )
    from satrl.experiments.preregistration import PreregistrationError
    from satrl.experiments.spec import expand, load_grid, select, size_problem
    from satrl.experiments.status import cost_line, has_checkpoint, run_status

    if why := _bad_flag(args):
        print(f"satrl grid: {why}", file=sys.stderr)
        return 2
    try:
        spec = load_grid(args.grid, check_paths=not args.dry_run)
    except ValueError as e:
        print(f"satrl grid: {e}", file=sys.stderr)
        return 2
    if why := size_problem(spec, args.seeds):  # before any run is built, --dry-run too
        print(f"satrl grid: {args.grid}: {why}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / spec.name)
    if why := folder_problem(out):
        print(f"satrl grid: --out {out}: {why}", file=sys.stderr)
        return 2
    try:
        guard_changes(spec, out, args.seeds, args.rerun_changed, dry_run=True, only=args.only)
    except GridChangedError as e:
        print(f"satrl grid: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        changed = {r.name for r in changed_runs(spec, out, args.seeds)[0]}  # --rerun-changed: they start over
        runs = thread_capped(select(expand(spec, out, args.seeds), args.only), args.workers, args.threads)
        refused = config_problems([r for r in runs if r.base.exists()])
        states = [(r.cell, r.lag, r.run_dir, "new" if r.name in changed else run_status(r.run_dir)) for r in runs]
        for run, (*_, state) in zip(runs, states, strict=True):
            cmd = default_command(run, state != "new" and state != "finished" and has_checkpoint(run.run_dir))
            note = "" if run.base.exists() else "  # base config missing!"
            note = f"  # config refused: {refused[run.name]}" if run.name in refused else note
            print(f"[{'skip' if state == 'finished' else state}] {run.name}: {' '.join(cmd)}{note}")
        print(f"satrl grid {spec.name}: {cost_line(states, args.workers)}", file=sys.stderr)
        return 0
    runs = select(expand(spec, out, args.seeds), args.only)
    if not runs:
        print(f"satrl grid: --only {' '.join(args.only or [])} matches no run of {args.grid}", file=sys.stderr)
        return 2
    try:  # the checks again, under the grid's lock: another grid may have run into --out since
        result = run_grid_spec(spec, out, args.seeds, args.workers, threads=args.threads, only=args.only,
                               rerun_changed=args.rerun_changed,
                               allow_commit_change=args.allow_commit_change)  # fmt: skip
    except (GridBusyError, GridChangedError, GridConfigError, PreregistrationError) as e:
        print(f"satrl grid: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only or full --out (its runs' children are stopped: the runner's _drive)
        print(f"satrl grid: cannot write into --out {out}: {os_problem(e, str(out))}", file=sys.stderr)
        return 2
    return result.exit_code
