"""The resumable state of ``satrl pretrain`` (``--save-every N``, ``--resume``): a pretraining run outlives a session.

The state of ``--out DIR`` lives in ``DIR/resume/``, written by :func:`satrl.training.checkpoint.save_checkpoint`:
``resume/step-NNNNNN/`` holds ``model.safetensors`` (the weights), ``state.safetensors`` (AdamW's moments and steps,
the torch RNG state as a uint8 tensor) and ``state.json`` (strict JSON: the step, the history, the loss EMA, the
training seconds so far, the learning-rate schedule, the settings, the last train prompt consumed), with a checksummed
manifest; ``resume/latest`` names it. The folder is written under a temporary name and renamed into place, and
``latest`` is replaced after it, so a run killed mid-write leaves the previous state or the new one, never a torn one.
Nothing is pickled.

Resuming needs the settings that shape the training trajectory (:data:`TRAJECTORY`) to equal the saved ones; a
difference is refused in one line naming the flag. The others (``--steps``, ``--stop-avg``, the eval flags) may
change: ``--steps N`` is a prefix of any longer run, so ``--resume --steps M`` with ``M`` larger extends a run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from satrl.training.checkpoint import applying, damage, latest_checkpoint, load_checkpoint, save_checkpoint
from satrl.training.placement import cpu_copy

RESUME = "resume"  # the state's folder under --out
FORMAT = 1
# The settings a resumed run must share with the saved one (anything that changes the weights step by step), with
# how the refusal names each.
TRAJECTORY = {
    "kind": "--kind",
    "task": "--task",
    "digits": "--digits",
    "ops": "--ops",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "warmup": "--warmup",
    "seed": "--seed",
    "threads": "--threads",
    "micro_batch_size": "--micro-batch-size",
    "model_cfg": "model_cfg (the recipe's)",
}


class ResumeError(ValueError):
    """A resume state that is missing, in the way, or saved by a run with other settings; one line."""


@dataclass
class LoopState:
    """Where a run stands after its step ``step``: what the resume state holds besides weights, optimizer and RNG.

    ``train_s`` is the training time of the whole run so far (every session), ``last_prompt`` the prompt of the last
    train problem consumed: a resumed run regenerates the stream up to there and checks that it lands on it."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    loss_ema: float = math.nan
    loss: float = math.nan
    train_s: float = 0.0
    last_prompt: str | None = None


def state_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / RESUME


def check_fresh(out_dir: str | Path) -> None:
    """Refuse to start a new run over the resume state of an earlier one: its final directory would land beside a
    state that ``--resume`` would later continue, and nothing is overwritten silently."""
    root = state_root(out_dir)
    if root.exists() or root.is_symlink():
        raise ResumeError(f"{root} holds the resume state of an earlier run; continue it with --resume, "
                          "or remove that folder (or pick another --out) to start over")  # fmt: skip


def save_state(
    out_dir: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, at: LoopState,
    settings: dict[str, Any],
) -> Path:  # fmt: skip
    """Write the state after step ``at.step`` atomically (older states of the run are removed)."""
    state = {
        "format": FORMAT,
        "settings": settings,
        "loop": dataclasses.asdict(at),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "rng": torch.get_rng_state(),
    }
    return save_checkpoint(state_root(out_dir), at.step, cpu_copy(model), state)


def restore_state(
    out_dir: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, settings: dict[str, Any]
) -> LoopState:
    """Load the latest state into ``model``, ``opt``, ``sched`` and the torch RNG, once its checksums match and its
    trajectory settings equal ``settings``; returns where the run stood."""
    root = state_root(out_dir)
    why = damage(root) if root.is_dir() else None
    if why:
        raise ResumeError(why)
    path = latest_checkpoint(root) if root.is_dir() else None
    if path is None:
        raise ResumeError(f"{root}: no resume state to continue (none was saved: --save-every); "
                          "run without --resume to start")  # fmt: skip
    weights, state = load_checkpoint(path)
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("settings"), dict):
        raise ResumeError(f"{path}: not a satrl pretrain resume state of format {FORMAT}")
    check_settings(state["settings"], settings, path)
    with applying(path):
        model.load_state_dict(weights)
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        torch.set_rng_state(state["rng"])
        return LoopState(**state["loop"])


def check_settings(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """A :class:`ResumeError` naming the first trajectory setting that differs between ``saved`` and ``now``."""
    for key, flag in TRAJECTORY.items():
        if saved.get(key) != now.get(key):
            raise ResumeError(f"{path}: saved with {flag} {saved.get(key)!r}, this run has {now.get(key)!r}; a "
                              "resumed run must train as the saved one did (same flags, or another --out)")  # fmt: skip

