"""One-off migration of run folders to today's format, so that no reader in ``src/`` keeps a legacy branch.

    python -m benchmarks.migrate_results docs/results            # rewrite in place, list what changed
    python -m benchmarks.migrate_results docs/results --check    # exit 1 if anything would change

ROOT is a grid output folder (``<cell>/lag<n>/seed<s>/``) or a folder of them (``docs/results``). Per run:

- ``config.yaml`` is loaded, its legacy keys are translated, and it is written back through today's loader
  (``build_config(data).model_dump(mode="json")``, as a new run saves it), so every key holds the value the
  current code would use. Translations, each reproducing what the run did:
  ``eval.n_problems: N`` (the first N eval problems, from before the val/test split) becomes the
  ``eval.val_problems`` / ``eval.test_problems`` counts of those N problems, which select the same problems in
  the same order (:func:`satrl.tasks.evaluate.split_val_test`); a config without ``eval.at_start`` comes from
  before the step-0 evaluation and gets ``at_start: false``.
- ``summary.json`` without ``summary_version`` (version 1) is completed with today's keys, computed from the
  run's own files: stored keys keep their values, except ``collapse_step``, which now means the eval rule
  (the stored one becomes ``reward_collapse_step``); ``summary_version`` becomes ``"1 (upgraded to 2)"``.
  Metric rows logged before ``lag/min`` and ``train/tokens`` are read as those runs were: the lowest lag
  with tokens in a ``bylag/<k>/frac_tokens`` bucket, and equal weights per step.
- ``metrics.jsonl(.gz)`` and ``eval.jsonl`` are never touched.

Per grid folder, a ``grid_status.json`` whose protocol record (``protocol``) predates ``added`` /
``added_at`` (the protocol's first commit, which the report dates its runs against) gets them from git, asked in
the folder's checkout (:func:`satrl.experiments.preregistration.first_commit`); where git cannot tell, it is left.

Idempotent: a migrated folder is a fixed point, and running it again after the config schema changes
rewrites each config.yaml in the new schema (the loader keeps reading the old one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from satrl.config import ConfigError, RunConfig, build_config
from satrl.config_base import dump_saved, load_saved
from satrl.diagnostics.summary import summarize_run
from satrl.experiments.store import GridRun, find_runs, metrics_path
from satrl.jsonl import read_jsonl, strict

LEGACY_MINIBATCHES = 4  # the default of train.minibatches before it became 1; every saved config holds the key


def _split_counts(task: dict, n_problems: int) -> tuple[int, int]:
    """(val, test) counts among the first ``n_problems`` eval problems of the config's task."""
    from satrl.tasks import make_task
    from satrl.tasks.evaluate import part_of

    problems = list(itertools.islice(make_task(task["name"], **task.get("kwargs", {})).problems("eval", 0), n_problems))
    if len(problems) < n_problems:
        raise ConfigError(f"eval.n_problems={n_problems}: the task has only {len(problems)} eval problems")
    val = sum(part_of(p) == "val" for p in problems)
    return val, len(problems) - val


def migrate_config(data: dict[str, Any]) -> RunConfig:
    """A saved config (any version) as today's :class:`RunConfig`, legacy keys translated (module docstring)."""
    data = json.loads(json.dumps(data))  # a deep copy
    ev = data.setdefault("eval", {})
    if "at_start" not in ev:  # saved before the step-0 evaluation existed: the run had none
        ev["at_start"] = False
    n = ev.pop("n_problems", None)
    if n is not None:
        task = {"name": "arithmetic", **data.get("task", {})}
        ev["val_problems"], ev["test_problems"] = _split_counts(task, int(n))
    data.setdefault("train", {}).setdefault("minibatches", LEGACY_MINIBATCHES)
    return build_config(data)


def _current_rows(rows: list[dict]) -> list[dict]:
    """Metric rows as today's trainer logs them, for the summary: ``lag/min`` (and ``lag/max``) from the
    ``bylag`` buckets that hold tokens where missing, ``train/tokens`` 1 (equal weights) where missing."""
    out = []
    for r in rows:
        r = dict(r)
        if isinstance(r.get("lag/mean"), (int, float)) and not ("lag/min" in r and "lag/max" in r):
            present = [int(k.split("/")[1]) for k, v in r.items() if k.startswith("bylag/")
                       and k.endswith("/frac_tokens") and isinstance(v, (int, float)) and math.isfinite(v) and v > 0]  # fmt: skip
            r.setdefault("lag/min", min(present) if present else r["lag/mean"])
            r.setdefault("lag/max", max(present) if present else r["lag/mean"])
        r.setdefault("train/tokens", 1.0)
        out.append(r)
    return out


def upgrade_summary(run_path: Path, summary: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """A version-1 summary completed with today's keys (module docstring); others, or a run without its
    metrics file, unchanged."""
    mp = metrics_path(run_path)
    if summary.get("summary_version") or mp is None:
        return summary
    evals = read_jsonl(run_path / "eval.jsonl") if (run_path / "eval.jsonl").exists() else []
    new = summarize_run(_current_rows(read_jsonl(mp)), evals, cfg.collapse, warmup_steps=cfg.steps_per_batch)
    out = {**new, **summary}  # the old keys keep their stored values ...
    # ... except the collapse, whose rule changed: the stored one was the training-reward rule
    out.update({k: new[k] for k in ("collapse_step", "collapse_unconfirmed_step", "collapse_score")})
    out["reward_collapse_step"] = summary.get("collapse_step", new["reward_collapse_step"])
    out["summary_version"] = f"1 (upgraded to {new['summary_version']})"
    return out


def migrate_run(run: GridRun, write: bool = True) -> list[str]:
    """Migrate one run folder; the names of the files that changed (or would change, ``write=False``)."""
    changed = []
    cfg_path = run.path / "config.yaml"
    if not cfg_path.exists():
        return changed
    old_text = cfg_path.read_text()
    cfg = migrate_config(load_saved(old_text) or {})
    new_text = dump_saved(cfg.model_dump(mode="json"))  # as RunDir saves it
    if new_text != old_text:
        changed.append("config.yaml")
        if write:
            cfg_path.write_text(new_text)
    sum_path = run.path / "summary.json"
    if sum_path.exists():
        summary = json.loads(sum_path.read_text())
        upgraded = upgrade_summary(run.path, summary, cfg)
        if upgraded != summary:
            changed.append("summary.json")
            if write:
                sum_path.write_text(json.dumps(strict(upgraded), indent=2, allow_nan=False) + "\n")
    return changed


def migrate_status(grid: Path, write: bool = True) -> list[str]:
    """Add the protocol's first commit to a grid folder's ``grid_status.json`` record; ``["grid_status.json"]`` if
    it changed (or would, ``write=False``)."""
    from satrl.experiments.preregistration import first_commit

    path = grid / "grid_status.json"
    status = json.loads(path.read_text()) if path.is_file() else {}
    rec = status.get("protocol")
    if not rec or "added" in rec or not (added := first_commit(rec, grid)):
        return []
    if write:
        status["protocol"] = {**rec, "added": added[0], "added_at": added[1]}
        path.write_text(json.dumps(status, indent=1))  # as the grid writes it
    return ["grid_status.json"]


def grid_folders(root: Path) -> list[Path]:
    """root itself if it holds runs, else its subfolders that do."""
    if find_runs(root):
        return [root]
    return [p for p in sorted(root.iterdir()) if p.is_dir() and find_runs(p)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.migrate_results", description=__doc__.splitlines()[0])
    ap.add_argument("root", help="a grid output folder, or a folder of them (docs/results)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a run would change")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"migrate_results: no such folder {root}", file=sys.stderr)
        return 2
    total = 0
    for grid in grid_folders(root):
        counts: Counter[str] = Counter()
        runs = find_runs(grid)
        for run in runs:
            try:
                changed = migrate_run(run, write=not args.check)
            except ConfigError as err:
                print(f"migrate_results: {run.path / 'config.yaml'}: {err}", file=sys.stderr)
                return 2
            counts.update(changed)
        counts.update(migrate_status(grid, write=not args.check))
        n = len(runs)
        what = ", ".join(f"{k} in {v}" for k, v in sorted(counts.items())) or "nothing"
        print(f"{grid}: {n} runs; {'would change' if args.check else 'changed'}: {what}")
        total += sum(counts.values())
    return 1 if args.check and total else 0


if __name__ == "__main__":
    raise SystemExit(main())
