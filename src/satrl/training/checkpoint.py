"""Atomic checkpoints: weights as safetensors, everything else (optimizer, RNG, cursor, buffer) with torch.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` written under a temporary name and renamed into
place, then named in ``checkpoints/latest`` (itself replaced atomically). A killed run therefore always
finds either the previous complete checkpoint or the new complete one, never a torn one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    root: Path, step: int, weights: dict[str, torch.Tensor], state: dict[str, Any], keep: set[str] = frozenset()
) -> Path:
    """Write ``root/step-{step}`` atomically and point ``root/latest`` at it. Older checkpoints are removed,
    except those named in ``keep`` (e.g. the best-eval one)."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _atomic_text(root / "latest", name)
    for old in root.glob("step-*"):
        if old.name not in keep | {name}:
            shutil.rmtree(old, ignore_errors=True)
    return final


def mark_best(root: Path, name: str) -> None:
    _atomic_text(root / "best", name)


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return load_file(str(path / "model.safetensors")), torch.load(path / "state.pt", weights_only=False)
