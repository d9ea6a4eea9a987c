"""Pre-registration the tool enforces (issue 48): a grid whose file names its ``protocol:`` runs only while that
protocol is committed and unchanged, on one code commit, and every record says which.

- **Before a run starts**, :func:`protocol_record` requires the protocol file to be tracked by git and identical to
  its last commit (no staged or unstaged change), and returns what ``grid_status.json`` records of it: its path in
  the repository, the commit that last changed it, that commit's time and the file's blob hash. A protocol edited
  after its runs began is therefore visible in the history (the record's blob changes), and one never committed
  cannot govern a run.
- **A trial runs on one commit** (:func:`check_commit`): once a session of the grid has finished runs, a later
  session on another code commit (or on a checkout with uncommitted changes to the package) is refused unless told
  ``--allow-commit-change``: a trial runs from a pinned worktree, so later work never changes its runs.
- **The report flags early runs** (:func:`runs_before`): a run whose first session started before the protocol's
  first commit (``added_at``: dated sections appended later, each before the runs it governs, do not move it) was
  not governed by it.

Git is asked through its command line; outside a git checkout (an installed wheel) a grid naming a protocol is
refused, since nothing could show the order of protocol and runs.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["PreregistrationError", "check_commit", "first_commit", "protocol_record", "runs_before"]


class PreregistrationError(ValueError):
    """The grid's protocol or code commit does not allow a run to start (one line saying why and what to do)."""


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise PreregistrationError(f"protocol check needs git ({err})") from None


def protocol_record(protocol: Path) -> dict[str, str]:
    """``{"path", "commit", "committed_at", "blob", "added", "added_at"}`` of a committed, unchanged protocol file
    (``commit``: its last change; ``added``: its first commit, :func:`first_commit`) (a symlink's
    target: ``path`` is the target's in its checkout); else :class:`PreregistrationError` naming the file and the
    way out."""
    if not protocol.is_file():
        raise PreregistrationError(f"protocol {protocol}: no such file (the grid file's `protocol:` names it)")
    # A symlink is followed first: what governs the runs is the text it points to, so that file is the one that
    # must be committed and unchanged, in its own checkout (issue 60: an edited target passed as the link's blob).
    shown, protocol = protocol, protocol.resolve()
    where = protocol.parent
    top = _git(where, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        what = f"{shown} (a link to {protocol})" if shown != protocol else str(shown)
        raise PreregistrationError(f"protocol {what}: not in a git checkout, so its commit cannot be shown; run the "
                                   "grid from a clone")  # fmt: skip
    try:
        rel = protocol.relative_to(Path(top.stdout.strip()).resolve()).as_posix()
    except ValueError:  # git's top level is not above the resolved file (a checkout reached through a link)
        raise PreregistrationError(f"protocol {shown}: {protocol} is not inside its git checkout "
                                   f"{top.stdout.strip()}; name the file itself in `protocol:`") from None  # fmt: skip
    if _git(where, "cat-file", "-e", f"HEAD:{rel}").returncode != 0:  # staged is not committed
        raise PreregistrationError(f"protocol {rel} is not committed: commit it, alone, before the grid's first run")
    if _git(where, "status", "--porcelain", "--", protocol.name).stdout.strip():
        raise PreregistrationError(f"protocol {rel} has uncommitted changes: a protocol is not edited after its "
                                   "commit (append a dated section and commit it before the runs it governs)")  # fmt: skip
    log = _git(where, "log", "-1", "--format=%H %cI", "--", protocol.name).stdout.split()
    blob = _git(where, "rev-parse", f"HEAD:{rel}").stdout.strip()
    if len(log) != 2 or not blob:
        raise PreregistrationError(f"protocol {rel}: git shows no commit of it")
    rec = {"path": rel, "commit": log[0], "committed_at": log[1], "blob": blob}
    added = first_commit(rec, where)
    return {**rec, **({"added": added[0], "added_at": added[1]} if added else {})}


def first_commit(record: dict[str, str], where: Path) -> tuple[str, str] | None:
    """``(commit, time)`` that added the protocol a :func:`protocol_record` names, in the history of the commit the
    record names: a trial is pre-registered when its protocol is first committed, and the dated sections appended
    later (each before the runs it governs) do not move that. None where git cannot tell (``where`` is not in a
    checkout, or the recorded commit is not in it)."""
    try:
        top = _git(where, "rev-parse", "--show-toplevel")
        if top.returncode != 0:
            return None
        log = _git(Path(top.stdout.strip()), "log", "--diff-filter=A", "--format=%H %cI", record["commit"], "--",
                   record["path"])  # fmt: skip
    except PreregistrationError:
        return None
    lines = log.stdout.strip().splitlines() if log.returncode == 0 else []
    first = lines[-1].split() if lines else []  # newest first: the last line is the first add
    return (first[0], first[1]) if len(first) == 2 else None


def check_commit(history: list[dict[str, Any]], current: str | None, allow: bool) -> None:
    """Refuse a session on another code commit than the grid's earlier sessions that finished runs (or on a
    checkout with uncommitted package changes), unless ``allow``."""
    if allow:
        return
    if current is None or current.endswith("+dirty"):
        raise PreregistrationError(f"code at {current or 'no git commit'}: a pre-registered grid runs on a committed "
                                   "checkout (a pinned worktree: git worktree add ../wt COMMIT); or pass "
                                   "--allow-commit-change")  # fmt: skip
    earlier = sorted({h.get("git_commit") for h in history if h.get("finished") and h.get("git_commit")})
    if earlier and current not in earlier:
        raise PreregistrationError(f"this grid's runs were made at {', '.join(c[:12] for c in earlier)}, this checkout "
                                   f"is {current[:12]}: run it from a worktree at that commit (git worktree add "
                                   "../wt COMMIT), or pass --allow-commit-change and say why in the protocol")  # fmt: skip


def _first_start(run_dir: Path) -> datetime | None:
    try:
        sessions = json.loads((run_dir / "environment.json").read_text()).get("sessions") or []
        return datetime.fromisoformat(sessions[0]["started"]) if sessions else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def runs_before(run_dirs: dict[str, Path], committed_at: str) -> list[str]:
    """The runs (by name) whose first session started before the protocol's commit time (local times, as
    ``environment.json`` records them; the commit time is compared in the machine's local time)."""
    cut = datetime.fromisoformat(committed_at).astimezone().replace(tzinfo=None)
    return sorted(name for name, d in run_dirs.items() if (t := _first_start(d)) is not None and t < cut)
