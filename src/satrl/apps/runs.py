"""A run directory read back for use: its config, one of its checkpoints, that checkpoint's policy weights.

``satrl export`` (:mod:`satrl.apps.export`) and ``satrl eval RUN_DIR`` (:mod:`satrl.apps.eval`) read runs
through here and never write into them. A checkpoint is ``checkpoints/step-NNNNNN`` (:mod:`satrl.training.checkpoint`);
``checkpoints/latest`` is a one-line file naming the newest one. Its ``model.safetensors`` holds the full policy
in the trainer's fp32, on one process and under data parallel alike (rank 0 gathers the FSDP2 shards before it
writes, docs/design.md "Data parallel"), so a sharded checkpoint needs no process group to be read here.

Every refusal is a :class:`RunReadError`, one line naming the path: a folder that is not a run, a run with no
checkpoint, an unknown step, a ``latest`` that names anything but a checkpoint folder inside the run (a path
outside it is never followed), a checkpoint whose checksum record is damaged, weights that no longer match the
sha256 recorded when they were saved (the checks are :func:`satrl.training.checkpoint.verify`'s, as on resume).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from satrl.jsonl import loads

if TYPE_CHECKING:  # torch and the config load where they are used: `satrl export --help` needs neither
    import torch

    from satrl.config import RunConfig

NAME = re.compile(r"step-\d{6,}")  # how save_checkpoint names a checkpoint folder
WEIGHTS = "model.safetensors"


class RunReadError(ValueError):
    """A run folder or checkpoint that cannot be used as asked; one line naming the path (exit 2)."""


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is meant as a run directory (a ``config.yaml`` or ``checkpoints/`` of a run) rather than a
    Hugging Face model folder (``config.json``). A damaged run still counts, so that it is refused as a run."""
    p = Path(path)
    if not p.is_dir() or (p / "config.json").is_file():
        return False
    return (p / "config.yaml").is_file() or (p / "checkpoints").is_dir()


def run_config(run_dir: str | Path, step: int | None = None) -> RunConfig:
    """The resolved config a run saved (``config.yaml``), validated as ``satrl train --resume`` would: it must be
    the config the checkpoint at ``step`` (None: the latest) was trained with, complete and unedited but where
    resume allows a change (:func:`satrl.rundir.resume_check.check`); an emptied or edited one is refused."""
    import yaml

    from satrl.config import ConfigError, load_config
    from satrl.pipeline.errors import RunDirError
    from satrl.rundir.resume_check import check

    run = Path(run_dir)
    if not run.is_dir():
        raise RunReadError(f"{run}: no such run directory")
    if not (run / "config.yaml").is_file():
        raise RunReadError(f"{run}: not a run directory (no config.yaml in it)")
    try:
        cfg = load_config(run / "config.yaml")
    except ConfigError as err:
        raise RunReadError(f"{run / 'config.yaml'}: {_first_line(err)}") from None
    try:
        ckpt = checkpoint_of(run, step)
    except RunReadError:
        return cfg  # no checkpoint to check against: the caller's own checkpoint_of refuses the run
    try:
        raw = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
        check(run, ckpt, _trained_with(ckpt), raw, cfg.model_dump(mode="json"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise RunReadError(f"{run / 'config.yaml'}: unreadable ({_first_line(err)})") from None
    except RunDirError as err:
        raise RunReadError(_first_line(err)) from None
    return cfg


def _trained_with(ckpt: Path) -> dict | None:
    """The resolved config checkpoint ``ckpt`` recorded (``state.json``), or None for one from before the record."""
    from satrl.training.safe_state import decode

    try:
        config = loads((ckpt / "state.json").read_text()).get("config")
        return decode(config, {}) if isinstance(config, dict) else None
    except (OSError, ValueError, AttributeError, RecursionError) as err:  # RecursionError: decode of a deep tree
        raise RunReadError(f"{ckpt / 'state.json'}: unreadable ({_first_line(err)})") from None


def checkpoint_of(run_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint folder of ``run_dir`` at optimizer step ``step``, or the one ``checkpoints/latest`` names
    (the newest complete one when there is no ``latest``). It must lie inside the run folder once symlinks are
    resolved: a checkpoint is read from the run asked for, never from wherever a pointer leads."""
    run = Path(run_dir)
    ckpts = run / "checkpoints"
    if step is not None:
        path = ckpts / f"step-{step:06d}"
        if not _complete(path):
            kept = ", ".join(str(checkpoint_step(p)) for p in _kept(ckpts)) or "none"
            raise RunReadError(f"{path}: no checkpoint at step {step} in this run (steps kept: {kept})")
    else:
        path = _latest(ckpts)
    if not path.resolve().is_relative_to(run.resolve()):
        raise RunReadError(f"{path}: resolves to {path.resolve()}, outside the run directory {run}; refusing to "
                           "read a checkpoint from elsewhere")  # fmt: skip
    return path


def _latest(ckpts: Path) -> Path:
    pointer = ckpts / "latest"
    if not pointer.is_file():
        kept = _kept(ckpts)
        if not kept:
            raise RunReadError(f"{ckpts}: the run has no checkpoint yet (one is written every checkpoint.every "
                               "rollout batches and at the end)")  # fmt: skip
        return kept[-1]
    name = pointer.read_text().strip()
    if not NAME.fullmatch(name):  # a path ('../other/step-000010', '/abs') is never followed
        raise RunReadError(f"{pointer}: names {name!r}, not a checkpoint folder of this run (step-NNNNNN); "
                           "refusing to read outside the run directory")  # fmt: skip
    if not _complete(ckpts / name):
        raise RunReadError(f"{pointer}: names {name}, which is missing or incomplete (damaged run); choose a kept "
                           f"one with --step (kept: {', '.join(p.name for p in _kept(ckpts)) or 'none'})")  # fmt: skip
    return ckpts / name


def _complete(path: Path) -> bool:
    return path.is_dir() and (path / WEIGHTS).is_file() and (path / "state.json").is_file()


def _kept(ckpts: Path) -> list[Path]:
    return sorted(p for p in ckpts.glob("step-*") if NAME.fullmatch(p.name) and _complete(p))


def checkpoint_step(path: Path) -> int:
    """The optimizer step a checkpoint folder holds (its name: ``step-000006`` is step 6)."""
    return int(path.name.removeprefix("step-"))


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The policy weights of a checkpoint folder (``model.safetensors``), once the checkpoint's checksum record is
    intact and their sha256 equals the one it recorded when they were saved (:func:`verify`: the manifest, or
    ``state.json``'s ``files_sha256`` in a checkpoint written before it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from satrl.training.checkpoint import CheckpointError, ChecksumMismatch, verify

    weights = path / WEIGHTS
    try:
        verify(path, [WEIGHTS])
    except ChecksumMismatch:
        raise RunReadError(f"{weights}: does not match the sha256 recorded when it was saved (damaged on disk); "
                           "choose another checkpoint with --step") from None  # fmt: skip
    except CheckpointError as err:
        raise RunReadError(f"{_first_line(err)}; choose another checkpoint with --step") from None
    try:
        return load_file(str(weights))
    except (OSError, SafetensorError) as err:
        raise RunReadError(f"{weights}: unreadable ({_first_line(err)})") from None


def logged_eval(run_dir: str | Path, step: int) -> dict | None:
    """The run's own ``eval.jsonl`` row at ``step``, or None (no evaluation at that step, no log, or a damaged
    row: one whose scores are not numbers is skipped like a line that is not JSON)."""
    from satrl.diagnostics.summary import score_problem

    log = Path(run_dir) / "eval.jsonl"
    if not log.is_file():
        return None
    for line in reversed(log.read_text().splitlines()):  # advisory: a damaged line is skipped, not fatal
        try:
            row = loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("step") == step and not score_problem(row):  # a score "high": damaged
            return row
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
