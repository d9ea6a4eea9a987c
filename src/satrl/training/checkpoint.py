"""Atomic, pickle-free checkpoints: weights and every other tensor in safetensors, the rest in JSON.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` holding ``model.safetensors`` (the policy),
``state.safetensors`` (optimizer moments, snapshots, RNG, pending samples) and ``state.json`` (everything
else, with references into ``state.safetensors``; format: :mod:`satrl.training.safe_state`). It is written
under a temporary name, renamed into place, then named in ``checkpoints/latest`` (itself replaced
atomically). A killed run therefore finds the previous complete checkpoint or the new one, never a torn
one; a leftover temporary directory is ignored and removed by the next save. Loading never unpickles: a
checkpoint with a ``state.pt`` (the old, pickled format) is refused.
"""

from __future__ import annotations

import errno
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
        (tmp / "state.json").write_text(json.dumps(tree, allow_nan=False))
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


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in FILES) or (path / "state.pt").is_file()


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
        tree = json.loads((path / "state.json").read_text())
        state = decode(tree, load_file(str(path / "state.safetensors")), classes)
        return load_file(str(path / "model.safetensors")), state
    except (OSError, ValueError, UnsafeStateError, SafetensorError) as e:  # truncated or foreign files too
        raise CheckpointError(f"{path}: unreadable checkpoint ({_first_line(e)})") from e


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
