"""The run directory: resolved config, metrics.jsonl, eval.jsonl, checkpoints, summary.json.

Layout and keys: docs/metrics.md. A resumed run truncates its logs to the checkpoint it restarts from, so
the logs of a killed-and-resumed run equal those of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from satrl import faults
from satrl.config.run import RunConfig, load_config
from satrl.config_base import ConfigError, dump_saved
from satrl.diagnostics import summarize_run
from satrl.diagnostics.collapse import CollapseConfig, skipped_collapse
from satrl.diagnostics.summary import score_problem
from satrl.folders import LOCK, RUN_FILES, InUse, hold, linked, run_files
from satrl.folders import release as release_lock
from satrl.jsonl import append_jsonl, dumps, numbered_rows, read_jsonl, strict, write_jsonl
from satrl.pipeline.errors import RunDirError
from satrl.provenance import record_session
from satrl.training import checkpoint as ckpt
from satrl.types import Sample


@dataclass
class RunState:
    """Everything the loop needs besides the trainer to continue exactly where it stopped."""

    next_batch: int = 0
    next_submit: int = 0
    ready: dict[int, list[Sample]] = field(default_factory=dict)  # generated, not yet trained
    best: float = -math.inf  # the best val score so far (the best checkpoint's)
    # The steps evaluated so far (eval.jsonl's rows), which a resume checks the log against; None in a checkpoint
    # from before it was recorded.
    evals: list[int] | None = None


@dataclass
class Loaded:
    """A checkpoint as read from disk, for the loop to apply: the policy ``weights``, the trainer's state, the
    kept weight ``snapshots`` by version, the torch RNG state, the loop's cursor, the wall clock so far and the
    resolved config it was trained with (None in a checkpoint from before it was recorded)."""

    path: Path
    weights: dict[str, torch.Tensor]
    trainer: dict
    snapshots: dict[int, dict[str, torch.Tensor]]
    rng: torch.Tensor
    run: RunState
    wall_s: float
    config: dict | None = None


# What satrl writes into a run directory (and the grid runner's stdout.log / error.txt); anything else is the user's.
OWN = {*RUN_FILES, "stdout.log", "error.txt", LOCK}


def _foreign(path: Path, config: dict) -> str | None:
    """Why a fresh run must not write into ``path`` (an existing folder) as someone else's, or None: it holds
    names satrl never writes, or a config.yaml that is not a resolved satrl config (a user's own)."""
    names = sorted(p.name for p in path.iterdir() if p.name.removesuffix(".tmp") not in OWN)
    if names:
        return f"holds files satrl did not write ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    cfg = path / "config.yaml"
    if cfg.is_file():
        try:
            saved = yaml.safe_load(cfg.read_text())
        except (OSError, yaml.YAMLError):
            saved = None
        # every top-level key (two may be newer than the satrl that wrote it): a user's config sets a few
        if not isinstance(saved, dict) or not set(saved) <= set(config) or len(saved) < len(config) - 2:
            return "holds a config.yaml that is not a satrl run's resolved config"
    return None


def _check_new(path: Path, config: dict) -> None:
    """Raise RunDirError unless a fresh run may write into ``path``: nothing of the user's, and no file of a
    run (any one: a finished run without its metrics.jsonl still has checkpoints and logs to lose)."""
    why = _foreign(path, config)
    if why:
        raise RunDirError(f"out={path} {why}; a fresh run is written only into a new or empty folder: choose "
                          "another out=")  # fmt: skip
    held = run_files(path)
    if held and "config.yaml" in held:
        raise RunDirError(f"{path} already holds a run ({', '.join(held)}); resume it with --resume {path} "
                          "or pick another out=")  # fmt: skip
    if held:
        raise RunDirError(f"{path} holds files of a run ({', '.join(held)}) but no config.yaml to resume it "
                          "with; choose another out=")  # fmt: skip


def _lock(path: Path):
    """Hold ``path``'s lock (:func:`satrl.folders.hold`); a second process gets a RunDirError naming the holder."""
    try:
        return hold(path)
    except InUse as err:
        raise RunDirError(f"{path} is in use: satrl process {err.pid} is training in it; wait for it to end "
                          f"(or stop it), then run again") from None  # fmt: skip


def _checked(run: object) -> RunState:
    """``run`` if it is a RunState whose counters are counters (a damaged state.json can hold anything)."""
    if not isinstance(run, RunState):
        raise TypeError(f"run state is a {type(run).__name__}, not a RunState")
    for name in ("next_batch", "next_submit"):
        value = getattr(run, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeError(f"run state {name} is {value!r}, not a count")
    if not isinstance(run.ready, dict):
        raise TypeError(f"run state ready is a {type(run.ready).__name__}, not a dict")
    evals = run.evals
    steps = isinstance(evals, list) and all(type(s) is int and s >= 0 for s in evals)  # bool is no step
    if evals is not None and not (steps and evals == sorted(set(evals))):
        raise TypeError(f"run state evals is {str(evals)[:80]}, not the rising steps of the evaluations")
    return run


def _append_text(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _tensorboard(path: Path):
    """A TensorBoard writer when the `tensorboard` package is installed, else None (JSONL is the record)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(path))


def _finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class RunDir:
    """One run's directory. Plain arguments (:func:`satrl.launch.setup.build_run_dir` builds them from the config):

    Args:
        path: the directory.
        config: the resolved config as data (every default filled in), saved as ``config.yaml``.
        collapse: the collapse rules of the end-of-run summary.
        warmup_steps: optimizer steps the summary's collapse rule skips (one rollout batch).
        resume: continue the run in ``path`` instead of refusing a directory that holds one.
        data_parallel: the run trains under torchrun (its checkpoints keep the model and optimizer in shards).

    A fresh run refuses a folder that holds anything of the user's or any file of a run (:func:`_check_new`),
    leaving it byte-identical, and any run folder whose files are links out of it (:func:`satrl.folders.linked`);
    the folder is locked while the process trains in it (:meth:`release`). A resumed
    run writes nothing until the loop has checked the whole folder (:meth:`load`, :meth:`check_config`,
    :meth:`resume_at`), so a refused resume leaves it byte-identical (but for the lock file's pid).
    """

    def __init__(
        self, path: Path, config: dict, *, collapse: CollapseConfig, warmup_steps: int, resume: bool = False,
        data_parallel: bool = False,
    ) -> None:
        self.path, self.collapse, self.warmup_steps = Path(path), collapse, warmup_steps
        self.data_parallel = data_parallel
        self.ckpt_dir, self.config = self.path / "checkpoints", config
        why = linked(self.path)  # before anything is written: the lock file included
        if why:
            raise RunDirError(why)
        self._made = not self.path.exists()  # abandon() removes a folder this run made, and only that
        self.path.mkdir(parents=True, exist_ok=True)
        self._held = _lock(self.path)
        if not resume:
            try:  # under the lock: no other process can start a run here between the check and our write
                _check_new(self.path, config)
            except BaseException:
                self.release()
                raise
            self.save_config()
        self.t0 = time.perf_counter()
        self.wall_before = 0.0
        self.state = RunState()
        self.skipped_rows = 0  # malformed dataset rows the task skipped (summary.json: data/skipped_rows)
        self.changes: dict[str, list] = {}  # config changes a resume made (check_config), recorded by the loop
        self.stepped = False  # whether this session logged an optimizer step (abandon() undoes a start before one)
        self.tb = None if resume else _tensorboard(self.path / "tb")  # a resume's once it has checked the folder

    def save_config(self) -> None:
        tmp = self.path / "config.yaml.tmp"  # atomic: a killed run never leaves a torn config.yaml
        tmp.write_text(dump_saved(self.config))
        tmp.replace(self.path / "config.yaml")

    def release(self) -> None:
        """Let another process train in this folder (the lock also goes when this process dies). The lock file
        is removed while still held, so a finished run's folder keeps no ``.satrl.lock``."""
        if self._held is not None:
            release_lock(self.path, self._held)
            self._held = None

    def abandon(self) -> None:
        """A fresh run that failed before its first step (a missing model or dataset, an engine that never
        started): remove what it wrote, and the folder if it made it, and let go of the lock, so the same command
        with the fault fixed starts over in the same ``out=`` (issue 60: its config.yaml blocked that, and a
        ``--resume`` could only repeat the failure). Everything removed is this run's: :func:`_check_new` found
        no file of a run and nothing of the user's there."""
        if self.tb is not None:
            self.tb.close()
        for name in RUN_FILES:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        (self.path / "config.yaml.tmp").unlink(missing_ok=True)
        self.release()
        if self._made and not any(self.path.iterdir()):
            self.path.rmdir()

    @staticmethod
    def config_of(path: str | Path, overrides: list[str] = ()) -> RunConfig:
        """The saved config of a run directory (for ``--resume``), with ``out`` pinned to it."""
        if not (Path(path) / "config.yaml").is_file():
            raise ConfigError(f"--resume {path}: not a run directory (no config.yaml in it)")
        return load_config(Path(path) / "config.yaml", [*overrides, f"out={path}"])

    # -- start -------------------------------------------------------------------------------------
    def fresh(self) -> RunState:
        """Start over: the logs of an earlier attempt go; the cursor is at batch 0."""
        for name in ("metrics.jsonl", "eval.jsonl", "summary.json"):
            (self.path / name).unlink(missing_ok=True)
        self.state.evals = []
        return self.state

    def load(self) -> Loaded | None:
        """The latest complete checkpoint, for the loop to apply (:meth:`resume_at` then cuts the logs to it);
        None if the run was killed before (or while writing) its first checkpoint: the same command then starts
        over (:meth:`check_unstarted`). A checkpoint the run wrote and that is damaged or gone now (its files missing
        or changed, or a finished run without one) is a RunDirError or CheckpointError: starting over or going
        back would rewrite the logs."""
        why = ckpt.damage(self.ckpt_dir)
        if why:
            raise RunDirError(f"{why}; resuming would go back and rewrite the logs: restore it, or start a new run "
                              "with another out=")  # fmt: skip
        path = ckpt.latest_checkpoint(self.ckpt_dir)
        if path is None and (self.path / "summary.json").exists():
            raise RunDirError(f"{self.ckpt_dir}: no complete checkpoint, but the run finished (summary.json): "
                              "nothing to resume from; restore the checkpoints, or start a new run with another out=")  # fmt: skip
        if path is None:  # check_unstarted says so once the config checks out
            return None
        weights, state = ckpt.load_checkpoint(path, {"RunState": RunState, "Sample": Sample})
        with ckpt.applying(path):
            ckpt.check_layout(path, state["trainer"], self.data_parallel)
            config = state.get("config")
            if config is not None and not isinstance(config, dict):
                raise TypeError(f"config is a {type(config).__name__}, not a mapping")
            return Loaded(path, weights, state["trainer"], dict(state["snapshots"]), state["rng"],
                          _checked(state["run"]), float(state["wall_s"]), config)  # fmt: skip

    def check_config(self, loaded: Loaded) -> int:
        """Check config.yaml and the resumed run's config against the config ``loaded`` was trained with
        (:mod:`satrl.rundir.resume_check`); keep the changes resume allows in :attr:`changes` and return the
        steps the run was trained for. Reads only."""
        from satrl.rundir.resume_check import check

        self.changes, planned = check(self.path, loaded.path, loaded.config, self._raw_config(), self.config)
        return planned

    def check_unstarted(self) -> None:
        """A resume of a run killed before its first checkpoint starts over, and may change only what any
        resume may (:mod:`satrl.rundir.resume_check`): config.yaml is what it is checked against. Reads only."""
        from satrl.rundir.resume_check import check_unstarted

        self.changes = check_unstarted(self.path, self._raw_config(), self.config)
        print(f"satrl: no complete checkpoint in {self.ckpt_dir}; starting from step 0", file=sys.stderr)

    def _raw_config(self):
        try:
            return yaml.safe_load((self.path / "config.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise RunDirError(f"{self.path / 'config.yaml'}: unreadable ({' '.join(str(err).split())[:200]})") from None

    def resume_at(self, step: int, state: RunState, wall_s: float, due=lambda step: True) -> None:
        """Continue the run from a loaded checkpoint at ``step``: log lines written after it are dropped (they
        will be redone), so the logs of a resumed run equal an uninterrupted one's. An evaluation at ``step``
        that is not ``due`` there any more (the end-of-run one of a run now extended) goes too, and the best
        val score is taken again from the evaluations kept: an extended run equals one longer run. Both logs
        are checked before either is rewritten (metrics: steps 1..``step``; eval: the steps ``state`` records
        as evaluated, :func:`_check_evals`), and a torn last line is reported only then, so a refused resume
        is one line; summary.json goes (the run's end writes it again)."""
        metrics, torn_metrics = self._rows_upto("metrics.jsonl", step)
        _check_steps(self.path / "metrics.jsonl", metrics, step)
        evals, torn_evals = self._rows_upto("eval.jsonl", step)
        _check_evals(self.path / "eval.jsonl", evals, torn_evals, state.evals, step)
        for n, row in evals:  # a score that is not a number would be skipped by the summary without a word
            if why := score_problem(row):
                raise RunDirError(f"{self.path / 'eval.jsonl'}:{n}: {why}; restore that line, then resume again")
        for name, n in (("metrics.jsonl", torn_metrics), ("eval.jsonl", torn_evals)):
            if n is not None:
                print(f"satrl: {self.path / name}:{n}: torn last line (killed while writing it) dropped; its step is "
                      "redone", file=sys.stderr)  # fmt: skip
        evals = [r for _, r in evals]
        state.evals = [r["step"] for r in evals]  # a checkpoint from before the record: the rows just checked
        if evals and evals[-1]["step"] == step and step > 0 and not due(step):
            evals.pop()
            state.evals.pop()
            scores = [r.get("val_avg_at_k", r.get("avg_at_k")) for r in evals]
            state.best = max([s for s in scores if isinstance(s, (int, float)) and math.isfinite(s)], default=-math.inf)
        self.state, self.wall_before = state, wall_s
        write_jsonl(self.path / "metrics.jsonl", [r for _, r in metrics])
        write_jsonl(self.path / "eval.jsonl", evals)
        (self.path / "summary.json").unlink(missing_ok=True)
        self.tb = _tensorboard(self.path / "tb")

    def _rows_upto(self, name: str, step: int) -> tuple[list[tuple[int, dict]], int | None]:
        """``(rows, torn)``: the rows of log ``name`` up to ``step`` with their line numbers, and the number of
        a torn last line (killed mid-append; None if there is none), which the caller drops. Damage anywhere
        else raises RunDirError: rewriting the log would lose rows silently."""
        path, numbered, torn = self.path / name, numbered_rows(self.path / name), None
        for i, (n, row) in enumerate(numbered):
            if row is not None and isinstance(row.get("step"), int):
                continue
            if i + 1 < len(numbered):
                raise RunDirError(f"{path}:{n}: damaged line inside the log (not a JSON row with a step); resuming "
                                  "would drop the rows after it: repair or restore that line, then resume again")  # fmt: skip
            torn = n
        kept = [(n, r) for n, r in numbered if r is not None and isinstance(r.get("step"), int) and r["step"] <= step]
        return kept, torn

    # -- during ------------------------------------------------------------------------------------
    def record_session(self, version: int, threads: int) -> None:
        """This session in ``environment.json``: the step it starts from, the code and the machine, the config
        changes a resume made (:func:`satrl.provenance.record_session`)."""
        record_session(self.path, version, threads, self.changes)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t0

    def log_step(self, step: int, metrics: dict) -> None:
        row = {"step": step, "wall_s": self.wall(), **metrics}
        self.stepped = True
        path = self.path / "metrics.jsonl"
        faults.point("metrics.write", lambda: _append_text(path, dumps(row)[:40]))  # dies leaving half a line
        append_jsonl(path, row)
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)

    def log_eval(self, step: int, result: dict) -> None:
        append_jsonl(self.path / "eval.jsonl", {"step": step, **result})
        if self.tb is not None:
            for k in ("avg_at_k", "greedy_acc", "val_avg_at_k", "test_avg_at_k"):
                if k in result:
                    self.tb.add_scalar(f"eval/{k}", result[k], step)
        score = result.get("val_avg_at_k", result["avg_at_k"])  # the best checkpoint is chosen on val
        if self.state.evals is not None:
            self.state.evals.append(step)  # the checkpoint records it: a resume checks eval.jsonl against it
        if score > self.state.best:
            self.state.best = score
            self._best_pending = True

    def checkpoint(self, step: int, weights: dict[str, torch.Tensor], payload: dict, write_extra=None) -> None:
        """Save checkpoint ``step`` (the policy ``weights``, the loop's ``payload`` plus the wall clock); the
        best one so far (on val) is kept by every later save. ``write_extra(dir)`` adds files to the checkpoint
        before it is marked complete (data parallel: the model and optimizer shards)."""
        payload = {**payload, "wall_s": self.wall(), "config": self.config}  # resume checks against the config
        best = (self.ckpt_dir / "best").read_text().strip() if (self.ckpt_dir / "best").exists() else None
        name = f"step-{step:06d}"
        if getattr(self, "_best_pending", False):
            best, self._best_pending = name, False
        ckpt.save_checkpoint(self.ckpt_dir, step, weights, payload, keep={best} if best else set(),
                             write_extra=write_extra)  # fmt: skip
        if best == name:
            ckpt.mark_best(self.ckpt_dir, name)

    # -- end ---------------------------------------------------------------------------------------
    def finish(self, last_step: int) -> dict:
        if self.tb is not None:
            self.tb.close()
        numbered = numbered_rows(self.path / "metrics.jsonl")  # never summarize a gappy log
        _check_steps(self.path / "metrics.jsonl", [(n, r or {}) for n, r in numbered], last_step)
        rows = read_jsonl(self.path / "metrics.jsonl", null_as_nan=True)
        summary = summarize_run(rows, read_jsonl(self.path / "eval.jsonl", null_as_nan=True), self.collapse,
                                warmup_steps=self.warmup_steps)  # fmt: skip
        summary.update(_skip_rule(rows, self.collapse, summary.get("collapse_step")))
        summary.update(wall_time_s=self.wall(), status="finished")
        summary["data/skipped_rows"] = self.skipped_rows
        summary = {k: (_finite_or_none(v) if isinstance(v, float) else v) for k, v in summary.items()}
        tmp = self.path / "summary.json.tmp"  # atomic: a kill never leaves a torn summary
        tmp.write_text(json.dumps(strict(summary), indent=2, allow_nan=False) + "\n")
        tmp.replace(self.path / "summary.json")
        return summary


def _skip_rule(rows: list[dict], cfg: CollapseConfig, collapse_step: int | None) -> dict:
    """The summary keys of the skip rule (:func:`satrl.diagnostics.collapse.skipped_collapse`): ``skipped_steps``,
    and ``collapse_step`` (the unconfirmed drop cleared) where the rule fires before the other rules' step."""
    flags = [isinstance(v := r.get("skipped"), (int, float)) and math.isfinite(v) and v > 0.5 for r in rows]
    out: dict = {"skipped_steps": sum(flags)}
    step = skipped_collapse(flags, [r["step"] for r in rows], cfg.max_skipped_frac)
    if step is not None and (collapse_step is None or step < collapse_step):
        out.update(collapse_step=step, collapse_unconfirmed_step=None)
    return out


def _check_evals(path: Path, numbered: list[tuple[int, dict]], torn: int | None, recorded: list[int] | None,
                 last: int) -> None:  # fmt: skip
    """Raise RunDirError unless the eval rows up to checkpoint step ``last`` are the evaluations the checkpoint
    records (``recorded``: the steps evaluated so far), one row each, in order: a row lost (cut off, deleted, the
    log emptied or gone) would drop an evaluation the resume never redoes and change the summary's best step and
    base. A checkpoint from before the record (``recorded`` None) needs rising steps only."""
    again = "restore the log, or start the run again with a new out="
    if recorded is None:
        for (_, prev), (n, row) in zip(numbered, numbered[1:]):
            if row["step"] <= prev["step"]:
                raise RunDirError(f"{path}:{n}: step {row['step']} after step {prev['step']} (rows repeated or out of "
                                  f"order); {again}")  # fmt: skip
        return
    for i, want in enumerate(recorded):
        if i < len(numbered) and numbered[i][1]["step"] == want:
            continue
        if i < len(numbered):
            n, row = numbered[i]
            raise RunDirError(f"{path}:{n}: step {row['step']} where the evaluation at step {want} belongs (rows "
                              f"missing or out of order; the checkpoint at step {last} records it); {again}")  # fmt: skip
        if torn is not None:
            raise RunDirError(f"{path}:{torn}: a line cut off where the evaluation at step {want} belongs (the "
                              f"checkpoint at step {last} records it); {again}")  # fmt: skip
        where = f"{path}:{numbered[-1][0]}: the log ends at step {numbered[-1][1]['step']}" if numbered else (
            f"{path}: the log is empty" if path.is_file() else f"{path}: the log is missing")  # fmt: skip
        raise RunDirError(f"{where}, but the checkpoint at step {last} records an evaluation at step {want} (rows "
                          f"missing); {again}")  # fmt: skip
    if len(numbered) > len(recorded):
        n, row = numbered[len(recorded)]
        raise RunDirError(f"{path}:{n}: an evaluation at step {row['step']} that the checkpoint at step {last} does not "
                          f"record (a row repeated or added); {again}")  # fmt: skip


def _check_steps(path: Path, numbered: list[tuple[int, dict]], last: int) -> None:
    """Raise RunDirError unless the rows are exactly steps 1..last, one per optimizer step, in order."""
    for want, (n, row) in enumerate(numbered, 1):
        if row.get("step") != want:
            raise RunDirError(f"{path}:{n}: step {row.get('step')} where step {want} belongs (rows missing or out "
                              "of order); restore the log, or start the run again with a new out=")  # fmt: skip
    if len(numbered) != last:
        where = f"{path}:{numbered[-1][0]}" if numbered else str(path)
        raise RunDirError(f"{where}: the log ends at step {len(numbered)} but the run is at step {last} (rows "
                          "missing); restore the log, or start the run again with a new out=")  # fmt: skip
