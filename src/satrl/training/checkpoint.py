"""Atomic, pickle-free checkpoints: weights and every other tensor in safetensors, the rest in JSON.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` holding ``model.safetensors`` (the policy),
``state.safetensors`` (optimizer moments, snapshots, RNG, pending samples) and ``state.json`` (everything
else, with references into ``state.safetensors``; format: :mod:`satrl.training.safe_state`). It is written
under a temporary name, renamed into place, then named in ``checkpoints/latest`` (itself replaced
atomically). A killed run therefore finds the previous complete checkpoint or the new one, never a torn
one; a leftover temporary directory is ignored and removed by the next save. Loading never unpickles: a
checkpoint with a ``state.pt`` (the old, pickled format) is refused. ``state.json`` records the sha256 of every
other file of its checkpoint (``files_sha256``), checked on loading: a file damaged on disk is refused in one line
instead of resumed from (a checkpoint written before the checksums loads unchecked).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from satrl import faults
from satrl.training.safe_state import UnsafeStateError, decode, encode

FILES = ("model.safetensors", "state.safetensors", "state.json")
CHECKSUMS = "files_sha256"  # the key of state.json's top level that holds them


class CheckpointError(ValueError):
    """A checkpoint that cannot (or must not) be loaded; one line naming the directory."""


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    root: Path, step: int, weights: dict[str, torch.Tensor], state: dict[str, Any], keep: set[str] = frozenset(),
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
        (tmp / "state.json").write_text(json.dumps({**tree, CHECKSUMS: _digests(tmp)}, allow_nan=False))
        faults.point("checkpoint.state")
        if final.exists():
            os.replace(final, root / f".{name}.old")
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space a full disk needs for the next try
        if not isinstance(e, OSError) and "No space left on device" in str(e):  # safetensors' own error type
            raise OSError(errno.ENOSPC, f"No space left on device writing checkpoint {final}") from e
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


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under a checkpoint folder but state.json (data parallel's shards included)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "state.json")
    return {str(p.relative_to(folder)): sha256_file(p) for p in files}


def _verify(path: Path, tree: Any) -> Any:
    """``tree`` without its recorded checksums, once every file they name matches; a CheckpointError naming
    the first file that is missing or changed. A tree without checksums (an older satrl's) passes as it is."""
    if not isinstance(tree, dict) or CHECKSUMS not in tree:
        return tree
    recorded = tree.pop(CHECKSUMS)
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{path}: damaged checkpoint ({CHECKSUMS} in state.json is not a mapping)")
    for name, digest in recorded.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{path}: damaged checkpoint (state.json names a file outside it: {name!r})")
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: {name} is missing; restore the checkpoint, or start a new run with "
                                  "another out=")  # fmt: skip
        if sha256_file(path / name) != digest:
            raise CheckpointError(f"{path}: {name} does not match the checksum recorded when it was saved (damaged "
                                  "on disk); restore the checkpoint, or start a new run with another out=")  # fmt: skip
    return tree


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in FILES) or (path / "state.pt").is_file()


def damage(root: Path) -> str | None:
    """Why the checkpoint ``root/latest`` names cannot be resumed from, when it was written and is damaged
    now (files missing, or the directory gone while others are left); None otherwise. A run never leaves
    this state (``latest`` is written after its checkpoint is complete, and never names one that is removed),
    so resuming from an older checkpoint or from step 0 would only hide the damage and rewrite the logs."""
    pointer = root / "latest"
    name = pointer.read_text().strip() if pointer.is_file() else ""
    if not name.startswith("step-") or "/" in name:
        return None
    path = root / name
    if path.is_dir() and not _complete(path):
        missing = [f for f in FILES if not (path / f).is_file()]
        return f"{path}: damaged checkpoint ({', '.join(missing)} missing)"
    if not path.exists() and any(root.glob("step-*")):
        return f"{pointer}: names {name}, which is gone (an older checkpoint is left)"
    return None


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``latest`` names, else the newest complete ``step-*`` directory, else None.
    Temporary (``.step-*.tmp``) and half-deleted directories never count."""
    pointer = root / "latest"
    if pointer.is_file():
        path = root / pointer.read_text().strip()
        if path.name.startswith("step-") and _complete(path):
            return path
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and _complete(p))
    return done[-1] if done else None


def load_checkpoint(path: Path, classes: dict[str, type] = {}) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:  # noqa: B006
    """``(weights, state)`` of a checkpoint directory; dataclasses in the state are rebuilt only for the
    names in ``classes``. Never unpickles anything."""
    if not (path / "state.json").is_file():
        if (path / "state.pt").is_file():
            raise CheckpointError(
                f"{path}: state.pt is a pickle (the old checkpoint format) and loading a pickle can run code; "
                "refusing to load it (start the run again, or convert it with a trusted copy of satrl)"
            )
        raise CheckpointError(f"{path}: not a checkpoint (no state.json)")
    try:
        tree = _verify(path, json.loads((path / "state.json").read_text()))
        state = decode(tree, load_file(str(path / "state.safetensors")), classes)
        return load_file(str(path / "model.safetensors")), state
    except CheckpointError:
        raise
    except (OSError, ValueError, UnsafeStateError, SafetensorError) as e:  # truncated or foreign files too
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
        raise CheckpointError(f"{path}: damaged checkpoint, its state does not fit this run ({_first_line(e)})") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
