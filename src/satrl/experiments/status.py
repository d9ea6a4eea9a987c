"""The state of one run directory, as the grid runner and the experiment store both see it.

No pandas and no pipeline here, so ``satrl grid`` stays light to import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` as a dict; None when it is missing, torn or not an object."""
    try:
        d = json.loads((Path(run_dir) / "summary.json").read_text())
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
