"""The state of one run directory, as the grid runner and the experiment store both see it.

No pandas and no pipeline here, so ``satrl grid`` stays light to import.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from satrl.jsonl import loads


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` as a dict; None when it is missing, torn or not an object."""
    try:
        d = loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def has_checkpoint(run_dir: str | Path) -> bool:
    """The run has something to resume from (``satrl train --resume`` continues it)."""
    ck = Path(run_dir) / "checkpoints"
    return ck.is_dir() and any(ck.iterdir())


def run_status(run_dir: str | Path, summary: dict[str, Any] | None = None) -> str:
    """``finished`` (a valid summary.json that says so) | ``failed`` (``error.txt``, which ``satrl grid``
    writes when a run fails) | ``partial`` (a checkpoint) | ``new``. ``summary``: the already read
    summary.json, if the caller has it."""
    summary = read_summary(run_dir) if summary is None else summary
    if summary is not None and summary.get("status") == "finished":
        return "finished"
    if (Path(run_dir) / "error.txt").exists():
        return "failed"
    return "partial" if has_checkpoint(run_dir) else "new"


_SESSION_KEYS = ("command", "git_commit", "cpu", "started", "updated", "workers", "threads")


def session_entry(status: dict[str, Any]) -> dict[str, Any] | None:
    """One grid invocation as a ``history`` entry of ``grid_status.json``: its command, commit, machine and times,
    and the runs it finished. None for a status without a ``started`` time (nothing ran)."""
    if "started" not in status:
        return None
    runs = status.get("runs") or {}
    finished = sorted(n for n, r in runs.items() if (r or {}).get("status") == "finished")
    return {k: status.get(k) for k in _SESSION_KEYS} | {"finished": finished}


def merge_status(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a grid's status, packed now) over ``old`` (the status already in the pack, from earlier sessions,
    maybe on other machines): every invocation once in ``history`` (by its ``started`` time, the fuller entry
    kept), each run's latest record, except that a run an earlier session finished and this one only skipped keeps
    the record that finished it; counts recomputed. Packing the same status twice changes nothing."""
    entries: dict[str, dict[str, Any]] = {}
    for h in [*(old.get("history") or []), session_entry(old), *(new.get("history") or [])]:
        if not isinstance(h, dict) or not h.get("started") or h["started"] == new.get("started"):
            continue  # new's own session is its top level, not history
        prev = entries.get(h["started"])
        if prev is None or len(h.get("finished") or []) >= len(prev.get("finished") or []):
            entries[h["started"]] = h
    runs = dict(old.get("runs") or {})
    for name, rec in (new.get("runs") or {}).items():
        if not ((rec or {}).get("status") == "skipped" and (runs.get(name) or {}).get("status") == "finished"):
            runs[name] = rec
    counts: dict[str, int] = {}
    for rec in runs.values():
        counts[(rec or {}).get("status", "pending")] = counts.get((rec or {}).get("status", "pending"), 0) + 1
    history = sorted(entries.values(), key=lambda h: h["started"])
    return {**new, "history": history, "counts": counts, "runs": dict(sorted(runs.items()))}


def left_share(run_dir: str | Path) -> float:
    """The share of a run's steps still to train: 1 without a checkpoint, else 1 - (its newest ``step-N``
    checkpoint's N) / (the ``steps:`` of its saved config.yaml); the grid resumes a partial run from there."""
    ck = Path(run_dir) / "checkpoints"
    done = [int(p.name[5:]) for p in ck.glob("step-*") if p.name[5:].isdigit()] if ck.is_dir() else []
    try:
        line = next(x for x in (Path(run_dir) / "config.yaml").read_text().splitlines() if x.startswith("steps:"))
        steps = int(line.split(":", 1)[1])
    except (OSError, StopIteration, ValueError):
        return 1.0
    return 1.0 - min(max(done, default=0), steps) / steps if steps > 0 else 1.0


def cost_line(runs: list[tuple[str, int, Path, str]], workers: int) -> str:
    """What a grid has cost and will cost, from its runs ``(cell, lag, run_dir, state)``: the finished runs'
    machine-hours (the sum of their ``wall_time_s``, one process each) and the rest's estimate, each at the median
    run time of its cell and lag's finished runs (else its cell's, else the grid's), times the share of its steps
    still to train (:func:`left_share`: a partial run resumes from its checkpoint, on the machine that holds it);
    the wall time is that over ``workers``. The arithmetic a trial's cost cap is checked with, done the same way
    every time."""
    done: dict[tuple[str, int], list[float]] = {}
    todo: list[tuple[str, int, float]] = []
    for cell, lag, run_dir, state in runs:
        wall = (read_summary(run_dir) or {}).get("wall_time_s") if state == "finished" else None
        if state != "finished":
            todo.append((cell, lag, left_share(run_dir)))
        elif isinstance(wall, int | float) and wall > 0:
            done.setdefault((cell, lag), []).append(float(wall))
    spent = sum(sum(v) for v in done.values()) / 3600
    n_done = len(runs) - len(todo)
    head = f"{n_done} of {len(runs)} runs finished, {spent:.2f} machine-hours spent (their wall_time_s)"
    if not todo:
        return head
    every = [w for v in done.values() for w in v]
    if not every:
        return f"{head}; {len(todo)} to run, no finished run to estimate their cost from"

    by_cell = {c: [w for (c2, _), v in done.items() if c2 == c for w in v] for c, _, _ in todo}
    left = sum(share * statistics.median(done.get((c, lag)) or by_cell[c] or every) for c, lag, share in todo) / 3600
    return (f"{head}; {len(todo)} to run, about {left:.2f} machine-hours at their cells' median run times "
            f"(about {left / max(1, workers):.1f} h at --workers {workers})")
