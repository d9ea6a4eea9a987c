"""Grid specs and the grid runner: `satrl grid GRID.yaml [--seeds N] [--workers W] [--out DIR]`.

A grid is a set of named cells (each a base config + `key=value` overrides), a list of lags and
a number of seeds. Every run `<cell>/lag<n>/seed<s>` is a black box: a fresh `satrl train` process
writing a run directory (see contracts: "Run directory"). The runner never imports the pipeline.

Resumability: a run with a valid summary.json is skipped; a run with a non-empty checkpoints/
folder but no valid summary is restarted with `--resume RUN_DIR`; anything else starts fresh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Scalar = str | int | float | bool | None
# Keys the grid itself controls; a cell or `extra:` setting them would silently fight the grid.
_RESERVED = {"seed": "--seeds / seeds:", "out": "--out", "lag.n": "lags:", "lag.schedule": "lag_schedule:",
             "steps": "steps:"}  # fmt: skip
_CELL_KEYS = {"base", "lags", "lag_schedule", "label"}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'objective': {'alpha': 0.8}} -> {'objective.alpha': 0.8}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def render_value(v: Any) -> str:
    """A YAML scalar as it reads back under yaml.safe_load: True -> 'true', None -> 'null', '8' -> "'8'"."""
    text = yaml.safe_dump(v, default_flow_style=True, width=10**9).strip()
    return text.removesuffix("...").strip()


def _check_overrides(overrides: dict[str, Any], where: str) -> dict[str, Any]:
    flat = _flatten(overrides)
    for k, v in flat.items():
        if k in _RESERVED:
            raise ValueError(f"{where}: key {k!r} is set by the grid; use {_RESERVED[k]} instead")
        if isinstance(v, dict | set):
            raise ValueError(f"{where}.{k}: values must be YAML scalars or lists, got {type(v).__name__}")
    return flat


class CellSpec(BaseModel):
    """One cell: optional base config, lags and schedule overriding the grid's, and config overrides."""

    model_config = ConfigDict(extra="forbid")
    base: str | None = None
    lags: list[int] | None = None
    lag_schedule: str | None = None
    label: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)


class GridSpec(BaseModel):
    """A grid file. `cells:` maps a name to a dict of overrides plus optional keys base/lags/lag_schedule/label."""

    model_config = ConfigDict(extra="forbid")
    name: str = "grid"
    description: str = ""
    base: str | None = None
    cells: dict[str, CellSpec]
    lags: list[int] = Field(min_length=1)
    lag_schedule: str = "broadcast"
    seeds: int = Field(default=3, ge=1)
    baseline: str | None = None
    steps: int | None = Field(default=None, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict)
    # Directory the relative base paths are resolved against (the grid file's folder); set by load_grid.
    root: str = "."

    @field_validator("cells", mode="before")
    @classmethod
    def _split_cells(cls, cells: Any) -> Any:
        if not isinstance(cells, dict) or not cells:
            raise ValueError("cells must be a non-empty mapping: name -> {key: value, ...}")
        out = {}
        for name, body in cells.items():
            if not _NAME_RE.match(str(name)):
                raise ValueError(f"cell name {name!r} may only use letters, digits and _ . + -")
            body = dict(body or {})
            if "overrides" in body:
                raise ValueError(
                    f"cells.{name}: write overrides directly in the cell, not under 'overrides:'"
                )
            own = {k: body.pop(k) for k in list(body) if k in _CELL_KEYS}
            out[str(name)] = {**own, "overrides": _check_overrides(body, f"cells.{name}")}
        return out

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        return _check_overrides(extra, "extra")

    @model_validator(mode="after")
    def _check(self) -> GridSpec:
        if self.baseline is not None and self.baseline not in self.cells:
            raise ValueError(f"baseline: {self.baseline!r} is not a cell; cells: {sorted(self.cells)}")
        for name, cell in self.cells.items():
            if cell.base is None and self.base is None:
                raise ValueError(f"cells.{name}: no base config; set `base:` on the grid or on the cell")
        return self

    def base_path(self, cell: str) -> Path:
        """The cell's base config: relative to the grid file's folder if it exists there, else to the cwd."""
        raw = self.cells[cell].base or self.base
        assert raw is not None
        p = Path(raw)
        if p.is_absolute():
            return p
        near = Path(self.root) / p
        return near if near.exists() or not p.exists() else p

    def cell_lags(self, cell: str) -> list[int]:
        return self.cells[cell].lags or self.lags

    def cell_schedule(self, cell: str) -> str:
        return self.cells[cell].lag_schedule or self.lag_schedule

    def label(self, cell: str) -> str:
        c = self.cells.get(cell)
        return c.label if c and c.label else cell


def load_grid(path: str | Path, check_paths: bool = True) -> GridSpec:
    """Read and validate a grid YAML. Errors (ValueError) name the bad field."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"grid file not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a grid is a YAML mapping with base/cells/lags/seeds")
    raw.setdefault("name", path.stem)
    raw["root"] = str(path.parent)
    try:
        spec = GridSpec.model_validate(raw)
    except ValidationError as e:
        msgs = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(grid)'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{path}: {msgs}") from None
    if check_paths:
        for cell in spec.cells:
            if not spec.base_path(cell).exists():
                raise ValueError(f"{path}: cells.{cell}: base config {spec.base_path(cell)} does not exist")
    return spec


@dataclass(frozen=True)
class Run:
    """One training run of the grid."""

    cell: str
    lag: int
    seed: int
    base: Path
    overrides: tuple[str, ...]  # "key=value", without seed= and out=
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.cell}/lag{self.lag}/seed{self.seed}"


def expand(spec: GridSpec, out: str | Path, seeds: int | None = None) -> list[Run]:
    """All runs, cell-major then lag then seed. Override order: extra, steps, schedule, lag, cell."""
    out = Path(out)
    runs = []
    for cell, c in spec.cells.items():
        for lag in spec.cell_lags(cell):
            ov = {**spec.extra}
            if spec.steps is not None:
                ov["steps"] = spec.steps
            ov["lag.schedule"] = spec.cell_schedule(cell)
            ov["lag.n"] = lag
            ov.update(c.overrides)
            items = tuple(f"{k}={render_value(v)}" for k, v in ov.items())
            for s in range(seeds or spec.seeds):
                runs.append(
                    Run(cell, lag, s, spec.base_path(cell), items, out / cell / f"lag{lag}" / f"seed{s}")
                )
    return runs


def default_command(run: Run, resume: bool) -> list[str]:
    """`python -m satrl train BASE k=v ... seed=S out=DIR [--resume DIR]`."""
    cmd = [sys.executable, "-m", "satrl", "train", str(run.base), *run.overrides, f"seed={run.seed}",
           f"out={run.run_dir}"]  # fmt: skip
    return [*cmd, "--resume", str(run.run_dir)] if resume else cmd


def has_valid_summary(run_dir: Path) -> bool:
    """summary.json exists, parses, and says status 'finished'."""
    try:
        s = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(s, dict) and s.get("status") == "finished"


def run_state(run_dir: Path) -> str:
    """'finished' | 'partial' (checkpoint, no valid summary) | 'new'."""
    if has_valid_summary(run_dir):
        return "finished"
    ck = Path(run_dir) / "checkpoints"
    return "partial" if ck.is_dir() and any(ck.iterdir()) else "new"


def thread_env(workers: int, threads: int | None = None) -> dict[str, str]:
    """Per-run thread settings so that workers x threads <= os.cpu_count()."""
    n = threads or max(1, (os.cpu_count() or 1) // max(1, workers))
    return {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), "SATRL_TORCH_THREADS": str(n)}


def _tail(path: Path, n_lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:])
    except OSError:
        return ""


def _git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None


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


def _spec_to_yaml(spec: GridSpec, seeds: int) -> str:
    """The grid as run (seeds filled in, bases resolved), readable back by load_grid(check_paths=False)."""
    cells = {}
    for name, c in spec.cells.items():
        body: dict[str, Any] = {"base": str(spec.base_path(name))}
        body.update(
            {k: getattr(c, k) for k in ("lags", "lag_schedule", "label") if getattr(c, k) is not None}
        )
        body.update(c.overrides)
        cells[name] = body
    d = spec.model_dump(exclude={"cells", "root", "base"})
    d.update(seeds=seeds, cells=cells)
    return yaml.safe_dump(d, sort_keys=False)


class _Runner:
    """The scheduling loop: at most `workers` child processes, status file after every change."""

    def __init__(self, spec, out, runs, workers, command_fn, env, console, live, poll_s):
        self.spec, self.out, self.workers, self.command_fn = spec, Path(out), workers, command_fn
        self.env, self.console, self.live, self.poll_s = env, console, live, poll_s
        self.result = GridResult(self.out)
        self.queue: list[Run] = []
        self.active: dict[str, tuple[Run, subprocess.Popen, float, Any]] = {}
        self.durations: list[float] = []
        self.meta = {"grid": spec.name, "out": str(out), "command": sys.argv, "git_commit": _git_commit(),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "workers": workers,
                     "threads": env.get("SATRL_TORCH_THREADS")}  # fmt: skip
        for r in runs:
            rec = RunRecord()
            if run_state(r.run_dir) == "finished":
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
        resume = run_state(run.run_dir) == "partial"
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "error.txt").unlink(missing_ok=True)
        if not resume:  # no checkpoint to continue from: stale files of an earlier attempt would mix in
            for f in ("metrics.jsonl", "metrics.jsonl.gz", "eval.jsonl", "summary.json"):
                (run.run_dir / f).unlink(missing_ok=True)
        cmd = [str(x) for x in self.command_fn(run, resume)]
        log = open(run.run_dir / "stdout.log", "a")  # noqa: SIM115 (closed in finish)
        log.write(f"=== satrl grid {time.strftime('%Y-%m-%dT%H:%M:%S')} {'resume' if resume else 'start'}: "
                  f"{' '.join(cmd)}\n")  # fmt: skip
        log.flush()
        # A new session: the terminal's Ctrl-C reaches only us, and we stop the children ourselves.
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        rec = self.result.records[run.name]
        rec.status, rec.resumed, rec.command, rec.error, rec.returncode = "running", resume, cmd, None, None
        self.active[run.name] = (run, p, time.monotonic(), log)

    def finish(self, name: str, rc: int) -> None:
        run, _, t0, log = self.active.pop(name)
        log.close()
        rec = self.result.records[name]
        rec.returncode, rec.wall_s = rc, round(time.monotonic() - t0, 3)
        if rc == 0 and has_valid_summary(run.run_dir):
            rec.status = "finished"
            self.durations.append(rec.wall_s)
            msg = f"[green]done[/] {name} ({rec.wall_s:.0f}s)"
        else:
            why = f"exit code {rc}" if rc != 0 else "exit code 0 but no valid summary.json"
            rec.status, rec.error = "failed", f"{why}\n{_tail(run.run_dir / 'stdout.log')}"
            (run.run_dir / "error.txt").write_text(rec.error + "\n")
            msg = f"[red]FAILED[/] {name} ({why}); see {run.run_dir / 'error.txt'}"
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
) -> GridResult:
    """Run every run of the grid not yet finished, `workers` at a time. Returns a GridResult.

    command_fn(run, resume) gives the child's argv. progress: rich live line (default: if stderr
    is a terminal), else one line per finished run. Ctrl-C / SIGTERM stop the children (SIGTERM, then
    SIGKILL after 10 s), mark them 'interrupted', and return with result.interrupted = True.
    """
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    cpus = os.cpu_count() or 1
    if workers > cpus:
        console.print(f"[yellow]--workers {workers} > {cpus} cores: using {cpus}[/]")
        workers = cpus
    workers = max(1, workers)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_seeds = seeds or spec.seeds
    (out / "grid.yaml").write_text(_spec_to_yaml(spec, n_seeds))
    full_env = {**os.environ, **thread_env(workers, threads), **(env or {})}
    progress = sys.stderr.isatty() if progress is None else progress
    runner = _Runner(
        spec, out, expand(spec, out, n_seeds), workers, command_fn, full_env, console, None, poll_s
    )

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
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)
    _print_summary(runner, console)
    return runner.result


def _print_summary(runner: _Runner, console) -> None:
    r = runner.result
    c = runner.counts()
    console.print(
        f"grid {runner.spec.name}: {c.get('finished', 0)} finished, {c.get('skipped', 0)} skipped (already done), "
        f"{c.get('failed', 0)} failed, {c.get('interrupted', 0)} interrupted, {c.get('pending', 0)} not started; "
        f"status in {r.out / 'grid_status.json'}"
    )
    for name in r.failed:
        console.print(f"  [red]failed[/] {name}: {(r.records[name].error or '').splitlines()[0]}")
    if r.interrupted:
        console.print("interrupted: run the same command again to resume (finished runs are skipped).")


# --- CLI ------------------------------------------------------------------------------------------
def add_grid_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grid", help="grid YAML, e.g. configs/grids/paper_table.yaml")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per cell and lag (default: the grid's)"
    )
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (threads split across them)")
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per run (default: cores // workers)"
    )
    parser.add_argument("--out", default=None, help="output folder (default: runs/<grid name>)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print each run's command and state, run nothing"
    )


def run_grid(args: argparse.Namespace) -> int:
    try:
        spec = load_grid(args.grid, check_paths=not args.dry_run)
    except ValueError as e:
        print(f"satrl grid: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / spec.name)
    if args.dry_run:
        for run in expand(spec, out, args.seeds):
            state = run_state(run.run_dir)
            cmd = default_command(run, state == "partial")
            missing = "" if run.base.exists() else "  # base config missing!"
            print(f"[{'skip' if state == 'finished' else state}] {run.name}: {' '.join(cmd)}{missing}")
        return 0
    result = run_grid_spec(spec, out, args.seeds, args.workers, threads=args.threads)
    return result.exit_code
