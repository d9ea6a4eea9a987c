"""Has a grid changed under its runs? A rerun of ``satrl grid`` into an ``--out`` that already holds runs
compares, run by run, the settings the grid now gives each run with those it was made with, so that a run
made with other settings is neither skipped as done nor described by a rewritten ``grid.yaml``.

What a run was made with: its ``config.yaml`` (the resolved config ``satrl train`` saved), for every key the
grid sets now or set then; where the run's config.yaml lacks a key (e.g. a preset), the override the grid
recorded in ``--out/grid.yaml``. So a grid that pins a default it ran with (``eval.n_problems: 100`` where
the default was 100, or a key added since, set to what the run did) changes nothing; ``steps: 4 -> 6`` does.
Beyond the grid's own keys, the run's whole config as the grid now resolves it (its base file read again) is
compared with config.yaml, key by key, for the keys config.yaml holds: an edited ``base.yaml`` is a change
too (:data:`RUNNER_KEYS`, which the runner sets per call, are not).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from satrl.config_base import load_saved
from satrl.experiments.spec import GridSpec, Run, _flatten, expand, load_grid, render_value, select
from satrl.experiments.status import has_checkpoint, run_status
from satrl.folders import InUse, hold, release

RUNNER_KEYS = ("out", "train.max_threads")  # set by the grid runner per call (run folder, thread cap)


class GridChangedError(ValueError):
    """The runs already in ``--out`` were made with other settings than the grid now gives them."""


def _recorded(run_dir: Path) -> dict[str, Any]:
    try:
        cfg = load_saved((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return _flatten(cfg) if isinstance(cfg, dict) else {}


def _same(raw: str | None, value: Any) -> bool:
    """Whether override text ``raw`` (None: not set) means the recorded ``value`` (1e-5 is 1.0e-05)."""
    if raw is None:
        return False
    v = yaml.safe_load(raw)
    if v == value or str(v) == str(value):
        return True
    try:
        return not isinstance(v, bool) and not isinstance(value, bool) and math.isclose(float(v), float(value))
    except (TypeError, ValueError):
        return False


def _diff(before: Run, now: Run, raw_base: str) -> list[str]:
    """What ``now`` sets differently from what run ``before`` (same name, base as written ``raw_base``) was
    made with."""
    o0 = dict(o.split("=", 1) for o in before.overrides)
    o1 = dict(o.split("=", 1) for o in now.overrides)
    recorded = _recorded(now.run_dir)
    b0, b1 = os.path.realpath(before.base), os.path.realpath(now.base)
    if not before.base.exists():  # a packed grid.yaml's repo-relative base, read from another folder
        b0 = b1 if b1.endswith(os.sep + os.path.normpath(raw_base)) else b0
    out = [f"base: {before.base} -> {now.base}"] if b0 != b1 else []
    for k in {**o0, **o1}:
        if k in recorded and k in o1:
            changed = not _same(o1[k], recorded[k])
        elif recorded and k not in recorded and k not in o0:  # a key newer than the run: the grid pins the
            changed = False  # behaviour the run had (README: old grids are pinned to their settings)
        else:
            changed = o0.get(k) != o1.get(k)
        if changed:
            out.append(f"{k}: {o0.get(k, recorded.get(k, '(unset)'))} -> {o1.get(k, '(unset)')}")
    return out or _resolved_diff(now, recorded)


def _resolved_diff(now: Run, recorded: dict[str, Any]) -> list[str]:
    """The keys config.yaml records differently from the config the grid now resolves for the run (its base
    file included); none when that config does not resolve (the grid's own check of it names the problem)."""
    from satrl.config.run import load_config
    from satrl.config_base import ConfigError

    try:
        resolved = _flatten(load_config(now.base, [*now.overrides, f"seed={now.seed}"]).model_dump(mode="json"))
    except (ConfigError, OSError):
        return []
    return [f"{k}: {recorded[k]} -> {v}" for k, v in resolved.items()
            if k in recorded and k not in RUNNER_KEYS and not _same_value(v, recorded[k])]  # fmt: skip


def _same_value(v: Any, value: Any) -> bool:
    """``_same(render_value(v), value)``, without that YAML round trip (a dump and a load per key, most of a
    rerun's check of 800 runs) where ``v`` is a value of ``value``'s type equal to it: a config value (a JSON
    type) reads back from its rendering equal to itself, so the round trip would find it the same too."""
    return (type(v) is type(value) and v == value) or _same(render_value(v), value)


def changed_runs(spec: GridSpec, out: Path, seeds: int | None) -> tuple[list[Run], list[str], int]:
    """The runs in ``out`` (finished, or with a checkpoint) that ``spec`` gives other settings than they were
    made with, what differs (``"steps: 4 -> 6"``), and the seed count of ``out/grid.yaml`` (0 if none)."""
    path = out / "grid.yaml"
    if not path.is_file():
        return [], [], 0
    try:
        old = load_grid(path, check_paths=False)
    except ValueError as e:
        raise GridChangedError(f"{path} is unreadable ({e}); restore it, or use a new --out") from None
    before = {r.name: r for r in expand(old, out, old.seeds)}
    runs, diffs = [], []
    for r in expand(spec, out, max(seeds or spec.seeds, old.seeds)):  # grid.yaml will describe them all
        if r.name not in before or not (run_status(r.run_dir) == "finished" or has_checkpoint(r.run_dir)):
            continue
        d = _diff(before[r.name], r, str(old.cells[r.cell].base or old.base))
        if d:
            runs.append(r)
            diffs += [x for x in d if x not in diffs]
    return runs, diffs, old.seeds


def guard_changes(spec: GridSpec, out: Path, seeds: int | None, rerun_changed: bool, dry_run: bool = False,
                  only: list[str] | None = None) -> int:  # fmt: skip
    """Raise GridChangedError if ``out`` holds runs made with other settings (``rerun_changed``: move them to
    ``out/.replaced/<time>/`` instead, so that they run again; nothing is deleted; with ``only`` patterns, every
    changed run must be among the runs they select, or nothing moves). Returns the seed count grid.yaml must
    record: no fewer than the runs ``out`` holds."""
    runs, diffs, old_seeds = changed_runs(spec, out, seeds)
    what = "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "")
    if runs and not rerun_changed:
        raise GridChangedError(
            f"{out} holds {len(runs)} run(s) made with other settings ({what}, e.g. {runs[0].name}); use a new "
            f"--out, or --rerun-changed to run them again (their folders move to {out / '.replaced'})"
        )
    outside = [r for r in runs if r not in select(runs, only)] if only else []
    if outside:
        raise GridChangedError(
            f"{out} holds {len(outside)} run(s) made with other settings ({what}) that --only does not select (e.g. "
            f"{outside[0].name}): --rerun-changed would move them aside without running them again; drop --only, "
            "or add them to it"
        )
    if runs and not dry_run:
        dest = _move_aside(runs, out / ".replaced" / time.strftime("%Y%m%dT%H%M%S"))
        print(f"satrl grid: {len(runs)} run(s) made with other settings ({what}) moved to {dest}; running them again",
              file=sys.stderr)  # fmt: skip
    return max(seeds or spec.seeds, old_seeds)


def _move_aside(runs: list[Run], dest: Path) -> Path:
    """Move each run's folder to ``dest/<name>`` while holding its lock; if another process trains in one of
    them (a `satrl train --resume` started by hand), raise GridChangedError before anything moves."""
    held = []
    try:
        for r in runs:
            held.append((r, hold(r.run_dir)))
    except InUse as err:
        for r, f in held:
            release(r.run_dir, f)
        raise GridChangedError(f"{err.folder} is in use: satrl process {err.pid} is training in it; nothing was "
                               "moved: wait for it to end (or stop it), then run again") from None  # fmt: skip
    for r, f in held:  # the lock file moves with its folder: released where it lies now
        (dest / r.name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(r.run_dir), str(dest / r.name))
        release(dest / r.name, f)
    return dest
