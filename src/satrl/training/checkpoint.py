"""Atomic, pickle-free checkpoints: weights and every other tensor in safetensors, the rest in JSON, every file
covered by a checksum in a manifest that checks itself.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` holding ``model.safetensors`` (the policy),
``state.safetensors`` (optimizer moments, snapshots, RNG, pending samples), ``state.json`` (everything
else, with references into ``state.safetensors``; format: :mod:`satrl.training.safe_state`) and, written last,
``manifest.json``. It is written under a temporary name, renamed into place, then named in ``checkpoints/latest``
(itself replaced atomically). A killed run therefore finds the previous complete checkpoint or the new one, never
a torn one; a leftover temporary directory is ignored and removed by the next save. Loading never unpickles: a
checkpoint with a ``state.pt`` (the old, pickled format) is refused.

**Manifest (format 2).** ``manifest.json`` is ``{"files": {name: sha256}, "format": 2, "self_sha256": ...}`` in
canonical JSON (sorted keys, no spaces, one trailing newline): ``files`` lists every file of the folder but the
manifest itself (``state.json`` and data parallel's shards included), ``self_sha256`` is the sha256 of the
canonical JSON of the other two keys. On loading (:func:`verify`) the manifest must hold exactly these keys, a
format this satrl knows, a matching ``self_sha256`` and the very bytes it was written as; every file it lists must
be there and match, and every file there must be listed. Anything else is a :class:`CheckpointError`, one line
naming the checkpoint and the file: a flipped bit anywhere (a value in ``state.json``, a key of the manifest, a
weight) is refused instead of resumed from.

**Format 1 (before the manifest).** ``state.json`` held the sha256 of every *other* file under its top-level key
``files_sha256`` (:data:`CHECKSUMS`); such checkpoints still load, checked that way. The two formats are told
apart without trusting the file that may be damaged: a checkpoint is read as format 1 only when it has no
``manifest.json`` *and* its ``state.json`` holds ``files_sha256`` (format 2 never writes that key, so a lost
manifest cannot make a new checkpoint pass as an old one; format 1 always wrote it, so a missing or renamed key
is refused, not read unchecked). Checkpoints older than the checksums (neither) are refused.

Residual cases, by design: (1) in format 1, ``state.json`` itself has no checksum (none was written), so a
flipped value there still loads; only its ``files_sha256`` key and entries are checked. (2) A new checkpoint
passes as format 1 only if its manifest is lost *and* its ``state.json`` gains a ``files_sha256`` mapping whose
every digest matches the other files: no damage short of a deliberate rewrite does that. (3) Checksums are not
signatures: whoever rewrites a file and its manifest consistently is not detected (the threat is damage on disk,
not an attacker with write access; a checkpoint from someone else is as trusted as its source, minus code
execution, which the pickle-free format rules out).

``checkpoints/latest`` is resolved inside the checkpoint root only: a pointer holding a path (``..``, ``/``, an
absolute path) or naming a folder that resolves outside the root (a symlink) is refused in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from satrl import faults
from satrl.folders import os_error_of
from satrl.jsonl import loads
from satrl.training.safe_state import UnsafeStateError, decode, encode

FILES = ("model.safetensors", "state.safetensors", "state.json")  # in every checkpoint, format 1 and 2 alike
MANIFEST = "manifest.json"  # format 2: the sha256 of every other file, and of itself
FORMAT = 2
CHECKSUMS = "files_sha256"  # format 1: the key of state.json's top level that held the other files' sha256
_KEYS = ("files", "format", "self_sha256")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ValueError):
    """A checkpoint that cannot (or must not) be loaded; one line naming the directory."""


class ChecksumMismatch(CheckpointError):
    """A file of a checkpoint whose sha256 differs from the one recorded when it was saved (``file``: its path)."""

    def __init__(self, path: Path, name: str):
        super().__init__(
            f"{path}: {name} does not match the checksum recorded when it was saved (damaged on disk)"
        )
        self.file = path / name


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    root: Path,
    step: int,
    weights: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: set[str] = frozenset(),
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``root/step-{step}`` atomically and point ``root/latest`` at it. Older checkpoints are removed,
    except those named in ``keep`` (e.g. the best-eval one). On a failed write (disk full) the temporary
    directory is removed and the previous checkpoint stays the latest. ``write_extra(folder)`` adds files
    before the rename (data parallel: every rank's shards)."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    tree, tensors = encode(state)
    for stale in root.glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        faults.point("checkpoint.weights")
        save_file(tensors, str(tmp / "state.safetensors"))
        if write_extra is not None:
            write_extra(tmp)
        (tmp / "state.json").write_text(json.dumps(tree, allow_nan=False))
        # last: it covers every other file, state.json included
        (tmp / MANIFEST).write_bytes(_manifest_bytes(_digests(tmp, MANIFEST)))
        faults.point("checkpoint.state")
        if final.exists():
            os.replace(final, root / f".{name}.old")
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space a full disk needs for the next try
        wrapped = None if isinstance(e, OSError) else os_error_of(e)  # safetensors' own error type
        if wrapped is not None and wrapped.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"No space left on device writing checkpoint {final}") from e
        if wrapped is not None and wrapped.errno == errno.EFBIG:  # the file-size limit
            raise OSError(errno.EFBIG, "File too large (over the file-size limit, ulimit -f)", str(final)) from e
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"{e.strerror} writing checkpoint {final}") from e
        raise
    _atomic_text(root / "latest", name)
    for old in [*root.glob("step-*"), *root.glob(".step-*")]:
        if old.name not in keep | {name}:
            shutil.rmtree(old, ignore_errors=True)
    return final


def mark_best(root: Path, name: str) -> None:
    _atomic_text(root / "best", name)


def sha256_file(path: Path) -> str:
    """The file's sha256, hex (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _digests(folder: Path, but: str) -> dict[str, str]:
    """sha256 of every file under a checkpoint folder but ``but`` (data parallel's shards included)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder) != Path(but))
    return {str(p.relative_to(folder)): sha256_file(p) for p in files}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _manifest_bytes(files: dict[str, str], fmt: int = FORMAT) -> bytes:
    body = {"files": files, "format": fmt}
    return _canonical({**body, "self_sha256": hashlib.sha256(_canonical(body)).hexdigest()}) + b"\n"


def checksums(path: Path) -> tuple[int, dict[str, str]]:
    """``(format, {file: sha256})`` as recorded in checkpoint ``path`` (every file of it: format 2's manifest covers
    ``state.json`` too, format 1's ``files_sha256`` every file but ``state.json``), once the record itself is intact
    and names exactly the files there are; files are not hashed here (:func:`verify`). A CheckpointError (one
    line naming the checkpoint and the file) otherwise. See the module docstring for how the formats are told apart."""
    if (path / MANIFEST).exists() or (path / MANIFEST).is_symlink():
        files = _manifest(path)
        _listed(path, files, MANIFEST, MANIFEST, FILES)
        return FORMAT, files
    try:
        tree = loads((path / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: {MANIFEST} is missing and state.json is unreadable ({_first_line(e)}): its "
                              "files cannot be checked") from None  # fmt: skip
    if not isinstance(tree, dict) or CHECKSUMS not in tree:
        raise CheckpointError(f"{path}: {MANIFEST} is missing, and state.json holds no {CHECKSUMS} (the checksums of "
                              "the format before it): lost or renamed, so its files cannot be checked")  # fmt: skip
    files = tree[CHECKSUMS]
    if not _digest_map(files):
        raise CheckpointError(
            f"{path}: damaged checkpoint ({CHECKSUMS} in state.json is not a mapping of sha256)"
        )
    _listed(path, files, "state.json", f"state.json's {CHECKSUMS}", FILES[:2])
    return 1, files


def _digest_map(files: Any) -> bool:
    return isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) and _SHA256.fullmatch(v)
                                           for k, v in files.items())  # fmt: skip


def _manifest(path: Path) -> dict[str, str]:
    """The ``files`` of ``path``'s manifest, once it is byte for byte as :func:`save_checkpoint` wrote it (its keys,
    and ``self_sha256`` the checksum of the rest). A format other than this satrl's is refused as unknown only when
    the manifest is intact (or has another layout, as a newer one may): a flipped bit in ``"format": 2`` is damage."""
    where = f"{path}: {MANIFEST}"
    try:
        raw = (path / MANIFEST).read_bytes()
        manifest = loads(raw)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where} is unreadable ({_first_line(e)})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where} is damaged (a {type(manifest).__name__}, not a mapping)")
    fmt, files = manifest.get("format"), manifest.get("files")
    keys_ok = sorted(manifest) == sorted(_KEYS)
    intact = keys_ok and type(fmt) is int and _digest_map(files) and raw == _manifest_bytes(files, fmt)
    if fmt != FORMAT and (intact or (type(fmt) is int and fmt > FORMAT and not keys_ok)):
        raise CheckpointError(f"{where} has format {fmt}, which this satrl does not know (it reads {FORMAT} and 1); "
                              "resume it with the satrl that wrote it")  # fmt: skip
    if not keys_ok:
        raise CheckpointError(f"{where} is damaged (its keys are {sorted(manifest)}, not {list(_KEYS)})")
    if not intact:
        raise CheckpointError(f"{where} does not match its own checksum (self_sha256; damaged on disk)")
    return files


def _listed(path: Path, files: dict[str, str], but: str, record: str, needed: Iterable[str]) -> None:
    """A CheckpointError unless ``files`` names every file of ``path`` but ``but``, no other, and all of ``needed``."""
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{path}: damaged checkpoint ({record} names a file outside it: {name!r})")
    for name in needed:
        if name not in files:
            raise CheckpointError(f"{path}: {name} has no checksum in {record} (entry lost)")
    there = {
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.relative_to(path) != Path(but)
    }
    if missing := sorted(set(files) - there):
        raise CheckpointError(f"{path}: {missing[0]} is missing (listed in {record})")
    if unlisted := sorted(there - set(files)):
        raise CheckpointError(
            f"{path}: {unlisted[0]} is not listed in {record} (added, renamed, or its entry lost)"
        )


def verify(path: Path, names: Iterable[str] | None = None) -> int:
    """Check checkpoint ``path``: its record (:func:`checksums`), then the sha256 of ``names`` (default: every file
    recorded). Returns the format (1 or 2); a CheckpointError naming the first file that is missing, unreadable or
    changed (a :class:`ChecksumMismatch` for a changed one). The one check of a checkpoint's files: resume
    (:func:`load_checkpoint`) and ``satrl export``/``satrl eval`` of a run (:mod:`satrl.apps.runs`) both use it."""
    fmt, files = checksums(path)
    for name in files if names is None else names:
        if name not in files:
            raise CheckpointError(f"{path}: {name} has no checksum recorded")
        try:
            digest = sha256_file(path / name)
        except OSError as e:
            raise CheckpointError(f"{path}: {name} is unreadable ({_first_line(e)})") from None
        if digest != files[name]:
            raise ChecksumMismatch(path, name)
    return fmt


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in FILES) or (path / "state.pt").is_file()


def _pointed(root: Path) -> str | None:
    """The name ``root/latest`` holds (None without one), once it names a folder of ``root`` itself: a path
    (``step-000006/../../x``, ``/abs``, ``..``) or a name that resolves outside ``root`` (a symlink) is a
    CheckpointError, one line: a checkpoint is never read from wherever a pointer leads."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    if name and (Path(name).parts != (name,) or name == ".."):
        raise CheckpointError(f"{pointer}: names {name!r}, not a checkpoint folder of {root} (step-NNNNNN); "
                              "refusing to read a checkpoint from outside it")  # fmt: skip
    if name:
        _inside(root, root / name, f"{pointer}: names {name}, which")
    return name


def _inside(root: Path, path: Path, what: str) -> None:
    if (path.exists() or path.is_symlink()) and not path.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"{what} resolves to {path.resolve()}, outside {root}; refusing to read a checkpoint "
                              "from elsewhere")  # fmt: skip


def damage(root: Path) -> str | None:
    """Why the checkpoint ``root/latest`` names cannot be resumed from, when it was written and is damaged
    now (files missing, or the directory gone while others are left); None otherwise. A run never leaves
    this state (``latest`` is written after its checkpoint is complete, and never names one that is removed),
    so resuming from an older checkpoint or from step 0 would only hide the damage and rewrite the logs.
    A ``latest`` that leads outside ``root`` is a CheckpointError."""
    name = _pointed(root) or ""
    if not name.startswith("step-"):
        return None
    path = root / name
    if path.is_dir() and not _complete(path):
        missing = [f for f in FILES if not (path / f).is_file()]
        return f"{path}: damaged checkpoint ({', '.join(missing)} missing)"
    if not path.exists():  # the only checkpoint deleted too: restarting at step 0 would rewrite the logs (issue 46)
        left = "an older checkpoint is left" if any(root.glob("step-*")) else "no checkpoint is left"
        return f"{root / 'latest'}: names {name}, which is gone ({left})"
    return None


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``latest`` names, else the newest complete ``step-*`` directory, else None.
    Temporary (``.step-*.tmp``) and half-deleted directories never count; one that resolves outside ``root``
    (a ``latest`` holding a path, a symlinked folder) is a CheckpointError."""
    name = _pointed(root)
    if name and name.startswith("step-") and _complete(root / name):
        return root / name
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and _complete(p))
    if done:
        _inside(root, done[-1], str(done[-1]))
    return done[-1] if done else None


def load_checkpoint(
    path: Path,
    classes: dict[str, type] = {},  # noqa: B006
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(weights, state)`` of a checkpoint directory, once every file matches its checksum (:func:`verify`);
    dataclasses in the state are rebuilt only for the names in ``classes``. Never unpickles anything."""
    if not (path / "state.json").is_file():
        if (path / "state.pt").is_file():
            raise CheckpointError(
                f"{path}: state.pt is a pickle (the old checkpoint format) and loading a pickle can run code; "
                "refusing to load it (start the run again, or convert it with a trusted copy of satrl)"
            )
        raise CheckpointError(f"{path}: not a checkpoint (no state.json)")
    try:
        try:
            fmt = verify(path)
        except CheckpointError as e:
            raise CheckpointError(
                f"{e}; restore the checkpoint, or start a new run with another out="
            ) from None
        tree = loads((path / "state.json").read_text())
        if fmt == 1:
            tree.pop(CHECKSUMS)
        state = decode(tree, load_file(str(path / "state.safetensors")), classes)
        return load_file(str(path / "model.safetensors")), state
    except CheckpointError:
        raise
    except (OSError, ValueError, UnsafeStateError, SafetensorError, RecursionError) as e:  # truncated, foreign, too deep
        raise CheckpointError(f"{path}: unreadable checkpoint ({_first_line(e)})") from e


def check_layout(path: Path, trainer: Any, data_parallel: bool) -> None:
    """A CheckpointError naming the way on when the checkpoint at ``path`` (its ``trainer`` state) was written
    by the other kind of run: one process (optimizer state in state.safetensors) or data parallel (model and
    optimizer in DCP shards, ``shards/``)."""
    sharded = (path / "shards").is_dir() or (isinstance(trainer, dict) and "opt" not in trainer)
    if data_parallel and not sharded:
        raise CheckpointError(f"{path}: written by a one-process run (no shards); resume it without torchrun")
    if not data_parallel and sharded:
        raise CheckpointError(f"{path}: written by a data-parallel run (its model and optimizer are in DCP shards); "
                              "resume it under torchrun")  # fmt: skip


@contextmanager
def applying(path: Path) -> Iterator[None]:
    """Around the code that puts a loaded checkpoint's state into the run: a state of the wrong structure (a
    hand-edited or foreign ``state.json``, weights of another model) is a :class:`CheckpointError` naming the
    checkpoint, one line, instead of whatever the first bad access raises."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{path}: damaged checkpoint, its state does not fit this run ({_first_line(e)})"
        ) from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
