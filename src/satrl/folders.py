"""The folders satrl writes: which files make a run, and the lock a process holds while it changes a folder.

A run directory (``satrl train``, the grid runner clearing a run before it starts) and a grid's ``--out``
(``satrl grid``) are each changed by one process at a time: the one holding an ``flock`` on the folder's lock
file, which records its pid. The kernel drops the lock of a killed process, so a stale file never blocks; a
clean release unlinks the file while still holding it. A leaf module (no torch, no pipeline): the grid runner
and the run directory both lock through it, so that they exclude each other.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

LOCK = ".satrl.lock"  # a run directory's: held by the process training in it (or preparing it)
GRID_LOCK = ".satrl-grid.lock"  # a grid's --out: held by the grid runner running into it
# What `satrl train` writes into a run directory: any one of them there means the folder holds a run (a
# finished run that lost its metrics.jsonl still has checkpoints and an eval log to lose).
RUN_FILES = ("config.yaml", "metrics.jsonl", "eval.jsonl", "summary.json", "environment.json", "checkpoints", "tb")


class InUse(Exception):
    """Another live process holds the folder's lock; ``pid`` is the one its lock file names ("?" if none yet)."""

    def __init__(self, folder: Path, pid: str) -> None:
        super().__init__(f"{folder} is in use by process {pid}")
        self.folder, self.pid = folder, pid


def run_files(folder: str | Path) -> list[str]:
    """The files of a run (:data:`RUN_FILES`) that ``folder`` holds, in that order; [] for none."""
    return [name for name in RUN_FILES if os.path.lexists(Path(folder) / name)]


def linked(folder: str | Path) -> str | None:
    """Why a process must not write into the run folder ``folder`` (one line naming the path), or None: a file
    it writes or deletes there (:data:`RUN_FILES`, the lock, ``checkpoints/latest``, ``best`` and its step
    folders) is a symlink, or ``checkpoints/`` resolves outside it. Writing through such a link would write
    (and prune) another folder's files, say another run's checkpoints."""
    folder = Path(folder)
    ckpts = folder / "checkpoints"
    names = [*(folder / n for n in (*RUN_FILES, LOCK, "config.yaml.tmp"))]
    if ckpts.is_dir() and not ckpts.is_symlink():
        names += sorted(ckpts.iterdir())
    for p in names:
        if p.is_symlink():
            return (f"{p} is a link (to {os.readlink(p)}); satrl never writes or deletes a run's files through a link "
                    "(it may lead outside the run folder): replace it with a real file or folder, or choose another "
                    "out=")  # fmt: skip
    if ckpts.exists() and not ckpts.resolve().is_relative_to(folder.resolve()):
        return (f"{ckpts} resolves to {ckpts.resolve()}, outside the run folder {folder}; satrl writes a run's "
                "files only inside its folder: choose another out=")  # fmt: skip
    return None


def hold(folder: str | Path, name: str = LOCK) -> IO:
    """Lock ``folder`` for this process (``folder/name``, flock), writing its pid there; raise :class:`InUse`
    naming the holder's pid if another process holds it. A lock taken on a file that its holder unlinked
    between our open and our flock (a clean release) is no lock: the file now at the path is locked instead."""
    path = Path(folder) / name
    while True:
        f = open(path, "a+")  # noqa: SIM115 (held until release())
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            raise InUse(Path(folder), pid) from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def release(folder: str | Path, held: IO, name: str = LOCK) -> None:
    """Give up a lock :func:`hold` took; its file is unlinked while still held, so a released folder keeps no
    lock file. ``folder`` is where the lock file is now (a locked run moved aside by the grid runner)."""
    (Path(folder) / name).unlink(missing_ok=True)
    held.close()


@contextmanager
def holding(folder: str | Path, name: str = LOCK) -> Iterator[None]:
    """Hold ``folder``'s lock for the block (:func:`hold`; :class:`InUse` if another process has it)."""
    held = hold(folder, name)
    try:
        yield
    finally:
        release(folder, held, name)


def folder_problem(path) -> str | None:
    """Why ``path`` cannot be (or become) a folder: it, or a folder above it, exists and is not a folder (a file,
    ``/dev/null``); None if it can, as far as that goes (permissions are met when it is written)."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if p.is_dir():
                return None
            return f"{p} exists and is not a folder" + ("" if p == path else f", so {path} cannot be one")
    return None


def usual_modes(folder: Path) -> None:
    """The modes a plain mkdir and open would give (mkdtemp makes the folder 0700 and transformers writes the
    weights 0600): an export or a converted model is meant to be shared like any model folder."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (a hidden name with the same suffix, so a figure keeps its format) for the
    block to write; moved over ``path`` when the block ends, removed if it raises: a reader never finds a
    half-written file (a report's figure cut off by a full disk, issue 60)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def os_problem(err: OSError, what: str = "") -> str:
    """An OSError as one line naming its file (``what`` where it has none): a command's read-only, full or
    vanished folder (``--out``), said without a traceback."""
    where = err.filename if err.filename is not None else what
    return f"{where}: {err.strerror or err}" if where else str(err.strerror or err)


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(err: BaseException, filename: str | None = None) -> OSError | None:
    """The OSError a library's own error type reports in its text (safetensors' SafetensorError: "I/O error: No
    space left on device (os error 28)"), for ``filename``; None for any other error (an OSError is itself)."""
    if isinstance(err, OSError):
        return err
    found = _OS_ERROR.search(str(err))
    return OSError(int(found.group(1)), os.strerror(int(found.group(1))), filename) if found else None
