"""The grid runner behind `satrl grid GRID.yaml [--seeds N] [--workers W] [--out DIR] [--dry-run]` (its command
line: `satrl.apps.grid`).

Every run `<cell>/lag<n>/seed<s>` of a grid (spec.py) is a black box: a fresh `satrl train` process
writing a run directory (layout: docs/metrics.md; its state: `status.run_status`). The runner never imports the pipeline.

Resumability: a run with a valid summary.json is skipped; a run with a non-empty checkpoints/
folder but no valid summary is restarted with `--resume RUN_DIR`; anything else starts fresh (its files
from an earlier attempt cleared first). A rerun whose settings differ from those of the runs already in
`--out` (its grid.yaml) refuses to mix them (GridChangedError) unless told `--rerun-changed`, which moves
those runs to `--out/.replaced/`.

Ownership: one grid runs into an `--out` at a time (GridBusyError names the other's pid), and a run's files
are cleared, moved or marked failed only while holding that run's lock (`satrl.folders`), the lock its
`satrl train` takes: a run another process trains in is left untouched and reported failed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from satrl.experiments.changes import GridChangedError, guard_changes
from satrl.experiments.preregistration import check_commit, protocol_record
from satrl.experiments.spec import GridSpec, Run, expand, load_grid, render_value, select, spec_to_yaml
from satrl.experiments.status import cost_line, has_checkpoint, run_status, session_entry
from satrl.folders import GRID_LOCK, RUN_FILES, InUse, hold, holding, release
from satrl.provenance import git_commit, machine_kind

__all__ = ["GridBusyError", "GridChangedError", "GridConfigError", "GridResult", "GridSpec", "Run", "default_command",
           "expand", "load_grid", "render_value", "run_grid_spec", "thread_env"]  # fmt: skip


def default_command(run: Run, resume: bool) -> list[str]:
    """`python -m satrl train BASE k=v ... seed=S out=DIR --no-progress`, or to resume
    `python -m satrl train k=v ... seed=S out=DIR --no-progress --resume DIR`: a resume takes the run's own
    config.yaml (and refuses a config file), the overrides are checked against it.

    --no-progress: the output goes to stdout.log, where a live bar would only add noise.
    """
    base = [] if resume else [str(run.base)]
    cmd = [sys.executable, "-m", "satrl", "train", *base, *run.overrides, f"seed={run.seed}", f"out={run.run_dir}",
           "--no-progress"]  # fmt: skip
    return [*cmd, "--resume", str(run.run_dir)] if resume else cmd


def invocation() -> list[str]:
    """This process's command as a user types it: ``satrl`` and its arguments, whether it was started as the
    ``satrl`` script or ``python -m satrl`` (whose argv[0] is the path of ``satrl/__main__.py`` inside the user's
    checkout or virtual environment, which a report must not print, issue 60)."""
    return ["satrl", *sys.argv[1:]]


def run_threads(workers: int, threads: int | None = None) -> int:
    """Threads per run so that workers x threads <= os.cpu_count() (``threads`` when given)."""
    return threads or max(1, (os.cpu_count() or 1) // max(1, workers))


def thread_capped(runs: list[Run], workers: int, threads: int | None = None) -> list[Run]:
    """The runs with the ``train.max_threads`` override that caps each one's trainer threads (see thread_env)."""
    cap = f"train.max_threads={run_threads(workers, threads)}"
    return [replace(r, overrides=(*r.overrides, cap)) for r in runs]


def thread_env(workers: int, threads: int | None = None) -> dict[str, str]:
    """Thread caps for the libraries under torch in each child; the trainer's own torch threads are capped by
    the ``train.max_threads`` override the grid adds to every run, so that its config.yaml records them."""
    n = run_threads(workers, threads)
    return {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}


def _tail(path: Path, n_lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:])
    except OSError:
        return ""


def _history(status_path: Path) -> list[dict[str, Any]]:
    """Earlier invocations of a resumed grid, oldest first, each with the runs it finished: a grid resumed
    across sessions and commits keeps, per run, the command and commit that produced it."""
    try:
        prev = json.loads(status_path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(prev, dict):
        return []
    history = [h for h in prev.get("history") or [] if isinstance(h, dict)]
    last = session_entry(prev)
    return history + ([last] if last else [])


class GridBusyError(ValueError):
    """Another grid is running into the same ``--out`` (it holds the folder's grid lock)."""


class GridConfigError(ValueError):
    """A run of the grid has a config its ``satrl train`` would refuse: one line naming the run; none started."""


def config_problems(runs: list[Run]) -> dict[str, str]:
    """``{run name: why}`` for each run whose config ``satrl train`` would refuse (its base file and overrides
    loaded as the child loads them), one line each. Runs that differ only by seed and folder share one check."""
    from satrl.config.run import load_config  # the config loader alone: pydantic, no torch
    from satrl.config_base import ConfigError

    problems, seen = {}, {}
    for r in runs:
        key = (r.base, r.overrides)
        if key not in seen:
            try:
                load_config(r.base, [*r.overrides, f"seed={r.seed}", f"out={r.run_dir}"])
                seen[key] = None
            except (ConfigError, OSError) as err:
                seen[key] = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if seen[key] is not None:
            problems[r.name] = seen[key]
    return problems


def check_configs(runs: list[Run]) -> None:
    """Raise GridConfigError naming the first run whose config would be refused, before any run starts (issue 60:
    the valid runs trained first, then each bad one failed: a lag of -1, ``lr: -1``, a misspelt key, a base that
    is not a config)."""
    problems = config_problems(runs)
    if problems:
        name, why = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more run(s))" if len(problems) > 1 else ""
        raise GridConfigError(f"run {name}{more}: {why}; no run was started: fix the grid file")


@dataclass
class RunRecord:
    status: str = "pending"  # pending|running|finished|skipped|failed|interrupted
    resumed: bool = False
    returncode: int | None = None
    wall_s: float | None = None
    error: str | None = None
    command: list[str] | None = None


@dataclass
class GridResult:
    """What run_grid_spec did. `failed` lists run names; exit_code is 0 only if none failed."""

    out: Path
    records: dict[str, RunRecord] = field(default_factory=dict)
    interrupted: bool = False

    def names(self, status: str) -> list[str]:
        return [k for k, r in self.records.items() if r.status == status]

    @property
    def failed(self) -> list[str]:
        return self.names("failed")

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)


@dataclass(frozen=True)
class _Launch:
    """How the runner starts and watches its child processes.

    Attributes:
        workers: at most this many children at once.
        command_fn: ``(run, resume) -> argv`` of the child that runs ``run``.
        env: the children's environment (thread caps included).
        poll_s: seconds between two looks at the children.
    """

    workers: int
    command_fn: Callable[[Run, bool], list]
    env: dict[str, str]
    poll_s: float


class _Runner:
    """The scheduling loop: at most `workers` child processes, status file after every change. ``live`` (the rich
    bar, or False without one) is set by :func:`_drive`."""

    def __init__(self, spec: GridSpec, out, runs: list[Run], launch: _Launch, console) -> None:
        workers, env = launch.workers, launch.env
        self.spec, self.out, self.workers, self.command_fn = spec, Path(out), workers, launch.command_fn
        self.env, self.console, self.live, self.poll_s = env, console, None, launch.poll_s
        self.result = GridResult(self.out)
        self.queue: list[Run] = []
        self.active: dict[str, tuple[Run, subprocess.Popen, float, Any]] = {}
        self.durations: list[float] = []
        # `started` names this session in every later pack's history (status.merge_status): to the microsecond, so
        # two sessions begun in one second (two machines, or a quick rerun) stay two
        started = datetime.now().isoformat(timespec="microseconds")
        self.meta = {"grid": spec.name, "out": str(out), "command": invocation(), "git_commit": git_commit(),
                     "cpu": machine_kind(), "started": started, "workers": workers,
                     "threads": env.get("OMP_NUM_THREADS")}  # fmt: skip
        self.meta["history"] = _history(self.out / "grid_status.json")
        for r in runs:
            rec = RunRecord()
            if run_status(r.run_dir) == "finished":
                rec.status = "skipped"
            else:
                self.queue.append(r)
            self.result.records[r.name] = rec

    # --- bookkeeping -------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for r in self.result.records.values():
            c[r.status] = c.get(r.status, 0) + 1
        return c

    def write_status(self) -> None:
        d = {**self.meta, "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "counts": self.counts(),
             "runs": {k: vars(v) for k, v in self.result.records.items()}}  # fmt: skip
        tmp = self.out / "grid_status.json.tmp"
        tmp.write_text(json.dumps(d, indent=1))
        os.replace(tmp, self.out / "grid_status.json")

    def eta_s(self) -> float | None:
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        now = time.monotonic()
        left = len(self.queue) * mean + sum(
            max(mean - (now - t0), 0.0) for _, _, t0, _ in self.active.values()
        )
        return left / self.workers

    def line(self):
        from rich.text import Text

        c, total = self.counts(), len(self.result.records)
        done = c.get("finished", 0) + c.get("skipped", 0)
        eta = self.eta_s()
        eta_txt = "?" if eta is None else time.strftime("%H:%M:%S", time.gmtime(eta))
        return Text.assemble(
            (f"grid {self.spec.name}: ", "bold"), f"done {done}/{total} (skipped {c.get('skipped', 0)})  ",
            (f"running {len(self.active)}  ", "cyan"), (f"failed {c.get('failed', 0)}  ", "red"), f"ETA {eta_txt}",
        )  # fmt: skip

    # --- processes ---------------------------------------------------------------------------
    def start(self, run: Run) -> None:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        rec = self.result.records[run.name]
        try:  # our child takes this lock again; until then no one else may start a run here, nor we touch theirs
            with holding(run.run_dir):
                resume = run_status(run.run_dir) != "finished" and has_checkpoint(run.run_dir)
                if (run.run_dir / "summary.json").exists():  # present but not valid: torn, hand-edited, or failed
                    self.console.print(f"[yellow]invalid summary.json[/] in {run.run_dir}: running it again")
                cmd = [str(x) for x in self.command_fn(run, resume)]
                log = _prepare(run.run_dir, resume, cmd)
        except InUse as err:  # e.g. a `satrl train --resume` started by hand
            rec.status = "failed"
            rec.error = f"{run.run_dir} is in use: satrl process {err.pid} is training in it; left untouched"
            if not self.live:
                self.console.print(f"[red]FAILED[/] {run.name}: {rec.error}")
            return
        rec.status, rec.resumed, rec.command, rec.error, rec.returncode = "running", resume, cmd, None, None
        # A new session: the terminal's Ctrl-C reaches only us, and we stop the children ourselves.
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                             preexec_fn=_die_with_parent)  # fmt: skip
        self.active[run.name] = (run, p, time.monotonic(), log)

    def finish(self, name: str, rc: int) -> None:
        run, _, t0, log = self.active.pop(name)
        log.close()
        rec = self.result.records[name]
        rec.returncode, rec.wall_s = rc, round(time.monotonic() - t0, 3)
        if rc == 0 and run_status(run.run_dir) == "finished":
            rec.status = "finished"
            self.durations.append(rec.wall_s)
            msg = f"[green]done[/] {name} ({rec.wall_s:.0f}s)"
        else:
            why = f"exit code {rc}" if rc != 0 else "exit code 0 but no valid summary.json"
            rec.status, rec.error = "failed", f"{why}\n{_tail(run.run_dir / 'stdout.log')}"
            msg = f"[red]FAILED[/] {name} ({why}); see {run.run_dir / 'error.txt'}"
            try:  # a process that took the folder since our child ended owns it now: no error.txt there
                with holding(run.run_dir):
                    (run.run_dir / "error.txt").write_text(rec.error + "\n")
            except InUse as err:
                msg = f"[red]FAILED[/] {name} ({why}); its folder is in use by process {err.pid} now"
        if not self.live:
            self.console.print(msg)

    def stop_all(self, grace_s: float = 10.0) -> None:
        for _, p, _, _ in self.active.values():
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, (_, p, _, _) in list(self.active.items()):
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
            self.active[name][3].close()
            self.result.records[name].status = "interrupted"
            self.result.records[name].returncode = p.returncode
        self.active.clear()

    def step(self) -> bool:
        """Reap finished children, start queued runs; True if anything changed."""
        changed = False
        for name, (_, p, _, _) in list(self.active.items()):
            rc = p.poll()
            if rc is not None:
                self.finish(name, rc)
                changed = True
        while self.queue and len(self.active) < self.workers:
            self.start(self.queue.pop(0))
            changed = True
        return changed

    def loop(self) -> None:
        self.write_status()
        while self.queue or self.active:
            if self.step():
                self.write_status()
            if self.live:
                self.live.update(self.line())
            time.sleep(self.poll_s)
        self.write_status()


def _prepare(run_dir: Path, resume: bool, cmd: list[str]):
    """Make ``run_dir`` ready for ``cmd`` (the caller holds its lock) and return its stdout.log, open for the
    child. A fresh start clears every run file of an earlier attempt (a run without a checkpoint has nothing to
    continue from): `satrl train` refuses a folder holding any, and stale lines would mix in."""
    (run_dir / "error.txt").unlink(missing_ok=True)
    for name in () if resume else (*RUN_FILES, "metrics.jsonl.gz"):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    log = open(run_dir / "stdout.log", "a")  # noqa: SIM115 (closed in finish)
    log.write(f"=== satrl grid {time.strftime('%Y-%m-%dT%H:%M:%S')} {'resume' if resume else 'start'}: "
              f"{' '.join(cmd)}\n")  # fmt: skip
    log.flush()
    return log


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGKILL it when the grid process dies, even by SIGKILL, so a
    rerun of the grid never races an orphaned run in the same run directory."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # the child's own session: it and whatever it spawned, nothing else
    except ProcessLookupError:
        pass


def run_grid_spec(
    spec: GridSpec,
    out: str | Path,
    seeds: int | None = None,
    workers: int = 1,
    command_fn: Callable[[Run, bool], list[str]] = default_command,
    *,
    threads: int | None = None,
    progress: bool | None = None,
    env: dict[str, str] | None = None,
    poll_s: float = 0.2,
    only: list[str] | None = None,
    rerun_changed: bool = False,
    allow_commit_change: bool = False,
) -> GridResult:
    """Run every run of the grid not yet finished, `workers` at a time. Returns a GridResult.

    command_fn(run, resume) gives the child's argv. progress: rich live line (default: if stderr
    is a terminal), else one line per finished run. only: shell patterns over run names (see `select`). Ctrl-C / SIGTERM stop the children (SIGTERM, then
    SIGKILL after 10 s), mark them 'interrupted', and return with result.interrupted = True.
    With the default command, a run whose config ``satrl train`` would refuse raises GridConfigError before
    anything starts or is written.
    Runs in ``out`` made with other settings raise GridChangedError (see ``changes.guard_changes``); an ``out``
    another grid is running into raises GridBusyError before anything in it changes. A grid naming a protocol
    starts only from a committed, unchanged protocol on the commit of its earlier runs (PreregistrationError;
    ``allow_commit_change`` lifts the commit rule), and records the protocol in ``grid_status.json``.
    """
    from rich.console import Console

    # In a pipe or log file rich would wrap each line at 80 columns, mid-phrase: one line per message there.
    console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
    cpus = os.cpu_count() or 1
    if workers > cpus:
        console.print(f"[yellow]--workers {workers} > {cpus} cores: using {cpus}[/]")
        workers = cpus
    workers = max(1, workers)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:  # a second grid here would clear the runs the first is starting: one grid per --out
        held = hold(out, GRID_LOCK)
    except InUse as err:
        raise GridBusyError(f"{out} is in use: satrl grid process {err.pid} is running a grid into it; wait for "
                            "it to end (or stop it), then run again") from None  # fmt: skip
    try:
        protocol = preregistered(spec, out, allow_commit_change)
        if command_fn is default_command:  # the children are `satrl train`: their configs, before a run changes
            check_configs([r for r in select(expand(spec, out, seeds or spec.seeds), only)
                           if run_status(r.run_dir) != "finished"])  # fmt: skip
        (out / "grid.yaml").write_text(spec_to_yaml(spec, guard_changes(spec, out, seeds, rerun_changed, only=only)))
        full_env = {**os.environ, **thread_env(workers, threads), **(env or {})}
        runs = thread_capped(select(expand(spec, out, seeds or spec.seeds), only), workers, threads)
        runner = _Runner(spec, out, runs, _Launch(workers, command_fn, full_env, poll_s), console)
        if protocol is not None:
            runner.meta["protocol"] = protocol
        done = set(runner.result.names("skipped"))  # what the runner found finished
        states = [(r.cell, r.lag, r.run_dir, "finished" if r.name in done else "new") for r in runs]
        console.print(f"grid {spec.name}: {cost_line(states, workers)}", markup=False)  # in the log of a long grid
        _drive(runner, console, sys.stderr.isatty() if progress is None else progress)
    finally:  # on an error and on Ctrl-C too (SIGKILL: the kernel drops the flock; the next grid takes over)
        release(out, held, GRID_LOCK)
    _print_summary(runner, console)
    return runner.result


def preregistered(spec: GridSpec, out: Path, allow_commit_change: bool) -> dict[str, str] | None:
    """The protocol's record when the grid names one, after checking it and the code commit
    (:mod:`satrl.experiments.preregistration`); None for a grid without a protocol (nothing checked)."""
    path = spec.protocol_path()
    if path is None:
        return None
    record = protocol_record(path)
    check_commit(_history(out / "grid_status.json"), git_commit(), allow_commit_change)
    return record


def _drive(runner: _Runner, console, progress: bool) -> None:
    """Run ``runner``'s loop to the end; Ctrl-C / SIGTERM stop its children and mark the result interrupted."""
    from rich.live import Live

    def _on_term(signum, frame):
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_term) if in_main else None
    old_int = signal.getsignal(signal.SIGINT) if in_main else None
    try:
        if progress:
            with Live(runner.line(), console=console, refresh_per_second=4, transient=False) as live:
                runner.live = live
                runner.loop()
        else:
            runner.live = False
            runner.loop()
    except KeyboardInterrupt:
        if in_main:  # a second Ctrl-C must not abandon children half-stopped
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.stop_all()
        runner.result.interrupted = True
        runner.write_status()
    except Exception:  # e.g. --out full or read-only under the status file: no child runs on without us
        runner.stop_all()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)


def _print_summary(runner: _Runner, console) -> None:
    r = runner.result
    c = runner.counts()
    console.print(
        f"grid {runner.spec.name}: {c.get('finished', 0)} finished, {c.get('skipped', 0)} skipped (already done), "
        f"{c.get('failed', 0)} failed, {c.get('interrupted', 0)} interrupted, {c.get('pending', 0)} not started; "
        f"status in {r.out / 'grid_status.json'}"
    )
    for name in r.failed:
        lines = [ln for ln in (r.records[name].error or "").splitlines() if ln.strip()]
        last = f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
        console.print(f"  [red]failed[/] {name}: {lines[0] if lines else '?'}{last}")
    if r.interrupted:
        console.print("interrupted: run the same command again to resume (finished runs are skipped).")
