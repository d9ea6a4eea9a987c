"""What ``--resume`` checks of a run's config before it touches a file of the run folder (docs/design.md,
"Resume validates the whole folder").

Each checkpoint records the resolved config it was trained with. ``config.yaml`` must be that config: complete
(every key the checkpoint records) and equal to it but where resume allows a change (a resume that stopped before
its next checkpoint rewrote it); the resumed run's config (config.yaml plus the command's overrides) likewise.
Resume may change only :data:`RESUMABLE`: the run's length, its evaluation and checkpoint cadence, and how long to
wait for the engine or how many threads to use, never what a step computes. :func:`check` returns the changes,
which the run records with the step they take effect from (``environment.json``, its session's
``config_changes``). A checkpoint from before the config was recorded is checked against config.yaml itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from satrl.config.run import build_config
from satrl.config_base import ConfigError
from satrl.pipeline.errors import RunDirError

RESUMABLE = ("steps", "eval.every", "checkpoint.every", "train.max_threads", "engine.timeout_s",
             "engine.start_timeout_s", "engine.max_restarts")  # fmt: skip
IGNORED = ("out",)  # pinned to the folder being resumed (a moved folder resumes)
_MISSING = "(missing)"


def flat(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train.lr": 1e-4, ...}``: a nested config as dotted keys (an empty section is one key)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _resolved(data: dict, what: str) -> dict[str, Any]:
    """Every key of the config ``data`` as this satrl resolves it (keys newer than its writer get their defaults)."""
    try:
        return flat(build_config(data).model_dump(mode="json"))
    except ConfigError as err:
        raise RunDirError(f"{what}: its config is not valid here ({err})") from None


def _differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    keys = [*a, *(k for k in b if k not in a)]
    return {k: (a.get(k, _MISSING), b.get(k, _MISSING)) for k in keys
            if k not in IGNORED and a.get(k, _MISSING) != b.get(k, _MISSING)}  # fmt: skip


def _shown(diff: dict[str, tuple[Any, Any]]) -> str:
    items = [f"{k} {old} -> {new}" for k, (old, new) in diff.items()]
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def check(folder: Path, checkpoint: Path, saved: dict | None, raw: Any, effective: dict) -> tuple[dict, int]:
    """``(changes, planned)``: the changes resume allows, ``{key: [trained with, now]}``, and the steps the run
    was trained for; a RunDirError (one line) for anything else. ``saved``: the config the checkpoint recorded
    (None for an older checkpoint); ``raw``: config.yaml as read; ``effective``: the resumed run's config."""
    where, name = folder / "config.yaml", checkpoint.name
    raw = raw if isinstance(raw, dict) else {}
    if saved is None:
        if len(set(effective) - set(raw)) > 2:  # an older checkpoint: config.yaml is all there is to go by
            raise RunDirError(f"{where}: not the complete resolved config of this run (sections missing); restore "
                              "it, or start a new run with another out=")  # fmt: skip
        saved = raw
    else:
        missing = [k for k in flat(saved) if k not in flat(raw) and k not in IGNORED]
        if missing:
            raise RunDirError(f"{where}: incomplete, {len(missing)} keys missing ({', '.join(missing[:3])}, ...): not "
                              f"the config checkpoint {name} was trained with; restore it, or start a new run with "
                              "another out=")  # fmt: skip
    trained = _resolved(saved, str(checkpoint))
    on_disk = {k: v for k, v in _differences(trained, _resolved(raw, str(where))).items() if k not in RESUMABLE}
    if on_disk:
        raise RunDirError(f"{where}: {_shown(on_disk)} (checkpoint {name} was trained with the first); restore "
                          "config.yaml, or start a new run with another out=")  # fmt: skip
    return _allowed(folder, f"what checkpoint {name} was trained with", trained, effective), int(trained["steps"])


def check_unstarted(folder: Path, raw: Any, effective: dict) -> dict:
    """The changes a resume of a run without a checkpoint (killed or failed before its first) makes to
    ``config.yaml`` (``raw``), ``{key: [before, now]}``; a RunDirError (one line) for a change resume may not
    make: it starts over, but as the run config.yaml records (issue 60: ``model.path=null`` was accepted)."""
    raw = raw if isinstance(raw, dict) else {}
    return _allowed(folder, f"{folder / 'config.yaml'}", _resolved(raw, str(folder / "config.yaml")), effective)


def _allowed(folder: Path, what: str, trained: dict[str, Any], effective: dict) -> dict:
    diff = _differences(trained, flat(effective))
    refused = {k: v for k, v in diff.items() if k not in RESUMABLE}
    if refused:
        raise RunDirError(f"--resume {folder}: {_shown(refused)} differ from {what}; resume may change only "
                          f"{', '.join(RESUMABLE)}: start a new run with another out= to change the rest")  # fmt: skip
    return {k: [old, new] for k, (old, new) in diff.items()}
