"""Read a grid's output folder (`<out>/<cell>/lag<n>/seed<s>/`) into pandas DataFrames, and pack it.

Every reader tolerates missing files and keys: a run that has not written summary.json yet is a
row with status 'partial'/'failed'/'new' and NaN summary fields; a metric a step did not log is NaN.
A truncated last line of a JSONL file (a run killed mid-write) is skipped.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from satrl.config_base import load_saved
from satrl.diagnostics.summary import late_mean, score_problem
from satrl.experiments.status import merge_status, run_status
from satrl.jsonl import loads, numbered_rows, read_jsonl  # the tolerant JSONL readers (torn lines skipped)
from satrl.provenance import ENVIRONMENT, commit_label, machine_label, read_sessions

SUMMARY_KEYS = ("best_avg_at_k", "best_step", "final_avg_at_k", "late_avg_at_k", "best_val_avg_at_k",
                "best_test_avg_at_k", "late_test_avg_at_k", "final_test_avg_at_k", "collapse_step",
                "collapse_unconfirmed_step", "reward_collapse_step", "eval_base", "lag_realized_mean",
                "lag_realized_min", "lag_realized_max", "d_pi_last25", "gate_rate_mean", "wall_time_s", "steps",
                "steps_per_batch", "summary_version", "status")  # fmt: skip
_RUN_RE = re.compile(r"^lag(-?\d+)$"), re.compile(r"^seed(\d+)$")
PACKED_FILES = ("summary.json", "config.yaml", "eval.jsonl", ENVIRONMENT)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


@dataclass(frozen=True)
class GridRun:
    """Where one run of a grid lies: ``<out>/<cell>/lag<lag>/seed<seed>`` (a live grid folder or packed results).
    Not :class:`satrl.rundir.files.RunDir`, which writes a run's files while it trains."""

    cell: str
    lag: int
    seed: int
    path: Path

    @property
    def name(self) -> str:
        return f"{self.cell}/lag{self.lag}/seed{self.seed}"


def find_runs(out_dir: str | Path) -> list[GridRun]:
    """Every `<cell>/lag<n>/seed<s>` folder under out_dir, sorted by (cell, lag, seed)."""
    found = []
    for p in Path(out_dir).glob("*/lag*/seed*"):
        lag_m, seed_m = _RUN_RE[0].match(p.parent.name), _RUN_RE[1].match(p.name)
        if p.is_dir() and lag_m and seed_m:
            found.append(GridRun(p.parent.parent.name, int(lag_m.group(1)), int(seed_m.group(1)), p))
    return sorted(found, key=lambda r: (r.cell, r.lag, r.seed))


def _from_config(run_path: Path) -> dict[str, Any]:
    """From the run's saved config.yaml: optimizer steps per rollout batch (train.minibatches x ppo_epochs), the
    trust region's upper radius ``eps_high`` and the learning rate ``lr`` (None where the config or the trust region
    has none)."""
    try:
        cfg = load_saved((run_path / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    out: dict[str, Any] = {"steps_per_batch": None, "eps_high": None, "lr": None}
    try:
        out["steps_per_batch"] = int(cfg["train"]["minibatches"]) * int(cfg["train"]["ppo_epochs"])
    except (KeyError, TypeError, ValueError):
        pass
    try:
        out["eps_high"] = float(cfg["objective"]["trust_region"]["eps_high"])
    except (KeyError, TypeError, ValueError):
        pass
    try:
        out["lr"] = float(cfg["train"]["lr"])
    except (KeyError, TypeError, ValueError):
        pass
    return out


class RunFileError(ValueError):
    """A run's summary.json holds a number that is not finite, or its eval.jsonl a score that is not a number
    (one line naming the file, line and key; exit 2)."""


def _finite(summary: dict[str, Any], path: Path) -> dict[str, Any]:
    """``summary`` (flattened, :func:`_flat`) if every number in it is finite, else a :class:`RunFileError`
    naming the key. satrl writes null where a run has no value; a NaN or Infinity there (an edited file, another
    writer) would be dropped from its cell by the statistics without a word (issue 60: 50.0 became 75.0)."""
    flat = _flat(summary)
    for key, value in flat.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise RunFileError(f"{path}: {key} is {value} (not a finite number; satrl writes null where a run has "
                               "no value): restore the file, set it to null, or remove the run")  # fmt: skip
    return flat


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json with its nested ``lag_realized`` {mean, min, max} as ``lag_realized_<k>`` columns."""
    out = dict(summary)
    lag = out.pop("lag_realized", None) or {}
    out.update({f"lag_realized_{k}": lag.get(k) for k in ("mean", "min", "max")})
    return out


def load_runs(out_dir: str | Path) -> pd.DataFrame:
    """One row per run dir: cell, lag, seed, run, status, path, machine, commit and every summary.json field as stored
    (runs from before ``summary_version`` 2 are migrated once by ``python -m benchmarks.migrate_results``); a
    non-finite number in a summary.json is a :class:`RunFileError`."""
    rows = []
    for r in find_runs(out_dir):
        summary = _read_json(r.path / "summary.json")
        row: dict[str, Any] = {k: None for k in SUMMARY_KEYS}
        if summary is not None:
            row.update(_finite(summary, r.path / "summary.json"), **_from_config(r.path))
        sessions = read_sessions(r.path)
        row.update(
            cell=r.cell, lag=r.lag, seed=r.seed, run=r.name, path=str(r.path), status=run_status(r.path, summary),
            machine=machine_label(sessions),  # the CPU kind(s) it ran on: bits depend on it
            commit=commit_label(sessions),  # and the code: a grid resumed on a later commit says so (report)
        )
        rows.append(row)
    cols = ["cell", "lag", "seed", "run", "status", "path", "machine", "commit"]
    # no runs: the columns a row would have ("status" once: a doubled label broke every later lookup, issue 60)
    df = pd.DataFrame(rows, columns=None if rows else cols + [k for k in SUMMARY_KEYS if k not in cols])
    for k in (*SUMMARY_KEYS, "eps_high"):
        if k not in ("status", "summary_version") and k in df:
            df[k] = pd.to_numeric(df[k], errors="coerce")
    return df[cols + [c for c in df.columns if c not in cols]]


def metrics_path(run_path: Path) -> Path | None:
    """A run's metrics log: metrics.jsonl while it trains, metrics.jsonl.gz once packed; None if neither."""
    for name in ("metrics.jsonl", "metrics.jsonl.gz"):
        if (run_path / name).exists():
            return run_path / name
    return None


def _long_frame(runs: list[GridRun], reader) -> pd.DataFrame:
    frames = []
    for r in runs:
        rows = reader(r.path)
        if not rows:
            continue
        df = pd.DataFrame(rows)
        df.insert(0, "seed", r.seed)
        df.insert(0, "lag", r.lag)
        df.insert(0, "cell", r.cell)
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["cell", "lag", "seed", "step"])
    df = pd.concat(frames, ignore_index=True)
    if "step" not in df:
        df["step"] = float("nan")
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    for c in df.columns[3:]:
        if df[c].dtype == object:
            converted = pd.to_numeric(df[c], errors="coerce")
            if converted.notna().sum() == df[c].notna().sum():  # numbers or None: make it float
                df[c] = converted
    return df.sort_values(["cell", "lag", "seed", "step"], kind="stable").reset_index(drop=True)


def load_metrics(out_dir: str | Path) -> pd.DataFrame:
    """Per-step metrics of every run (metrics.jsonl or .jsonl.gz): cell, lag, seed, step, <keys...>."""

    def reader(p: Path) -> list[dict]:
        mp = metrics_path(p)
        return read_jsonl(mp) if mp else []

    return _long_frame(find_runs(out_dir), reader)


def load_evals(out_dir: str | Path) -> pd.DataFrame:
    """Eval curves of every run: cell, lag, seed, step, avg_at_k, greedy_acc, k; a score that is not a number is
    a :class:`RunFileError` naming eval.jsonl:LINE."""

    def reader(p: Path) -> list[dict]:
        rows = numbered_rows(p / "eval.jsonl")  # a torn line (None) is skipped, as read_jsonl does
        for n, row in rows:
            if row is not None and (why := score_problem(row)):
                raise RunFileError(f"{p / 'eval.jsonl'}:{n}: {why}; restore that line, or remove the run")
        return [row for _, row in rows if row is not None]

    df = _long_frame(find_runs(out_dir), reader)
    for c in ("avg_at_k", "greedy_acc", "k"):
        if c not in df:
            df[c] = float("nan")
    return df


# runs-frame column -> eval.jsonl key: the report's secondary endpoints, each the late-window mean of its key with the
# primary endpoint's window (diagnostics.summary.late_mean), read from eval.jsonl so that runs whose summary.json
# predates them have them too
LATE_EVAL_KEYS = {"late_test_pass_at_k": "test_pass_at_k", "late_test_greedy_acc": "test_greedy_acc"}


def with_late_evals(runs: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with a column per :data:`LATE_EVAL_KEYS` (NaN where a run's eval log lacks the key). The window is
    the run's own: its summary's last optimizer step (``steps``), else its last eval's step."""
    out = runs.copy()
    for col in LATE_EVAL_KEYS:
        out[col] = float("nan")
    if evals.empty or not len(runs):
        return out
    groups = {key: g for key, g in evals.groupby(["cell", "lag", "seed"], sort=False)}
    for i, (cell, lag, seed, steps) in enumerate(zip(runs["cell"], runs["lag"], runs["seed"], runs["steps"])):
        g = groups.get((cell, lag, seed))
        if g is None:
            continue
        rows = g.drop_duplicates("step", keep="last").to_dict("records")  # a re-logged step: the last row wins
        last = int(steps) if pd.notna(steps) and steps > 0 else int(g["step"].max())
        for col, key in LATE_EVAL_KEYS.items():
            value = late_mean(rows, key, last) if key in g else None
            out.iloc[i, out.columns.get_loc(col)] = float("nan") if value is None else value
    return out


def load_grid_meta(out_dir: str | Path) -> dict[str, Any]:
    """The grid.yaml written by the runner (cell order, labels, baseline, description), or {}."""
    p = Path(out_dir) / "grid.yaml"
    meta = (yaml.safe_load(p.read_text()) or {}) if p.exists() else {}
    status = _read_json(Path(out_dir) / "grid_status.json") or {}
    meta.setdefault("git_commit", status.get("git_commit"))
    meta.setdefault("command", status.get("command"))
    if status.get("protocol"):  # a pre-registered grid's protocol record (experiments.preregistration)
        meta["protocol_record"] = status["protocol"]
    return meta


@dataclass
class GridResults:
    """A grid output folder in memory."""

    out_dir: Path
    runs: pd.DataFrame
    metrics: pd.DataFrame
    evals: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] == "finished"]

    def cell_order(self) -> list[str]:
        """Cells in the grid file's order, then any others alphabetically."""
        listed = list((self.meta.get("cells") or {}).keys())
        present = list(dict.fromkeys(self.runs["cell"]))
        return [c for c in listed if c in present] + sorted(c for c in present if c not in listed)

    def label(self, cell: str) -> str:
        body = (self.meta.get("cells") or {}).get(cell) or {}
        return body.get("label") or cell


def load_results(out_dir: str | Path) -> GridResults:
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ValueError(f"no such grid output folder: {out_dir}")
    evals = load_evals(out_dir)
    return GridResults(
        out_dir, with_late_evals(load_runs(out_dir), evals), load_metrics(out_dir), evals, load_grid_meta(out_dir)
    )


_ABS_CONFIGS = re.compile(r"(?<![\w.])/[^\s\"',:]*?/(configs/)")  # /any/checkout/configs/x.yaml -> configs/x.yaml
_ABS_PYTHON = re.compile(r"(?<![\w.])/[^\s\"',:]*/python[0-9.]*(?![\w/])")  # /venv/bin/python3.11 -> python
_ABS_MAIN = re.compile(r"(?<![\w.])/[^\s\"',:]*/satrl/__main__\.py")  # sys.argv[0] of `python -m satrl`


def portable(text: str, out_dir: Path) -> str:
    """``text`` without this machine's paths: the grid folder becomes ``runs/<name>``, a checkout's config
    files ``configs/...``, the interpreter ``python`` and the module entry point ``satrl``. Packed results
    are committed, and the repo holds no machine paths."""
    for p in sorted({str(out_dir.resolve()), str(out_dir.absolute())}, key=len, reverse=True):
        text = text.replace(p, f"runs/{out_dir.resolve().name}")
    text = _ABS_MAIN.sub("satrl", text)
    text = _ABS_PYTHON.sub("python", text)
    return _ABS_CONFIGS.sub(r"\1", text)


def _copy_portable(src: Path, dst: Path, out_dir: Path) -> Path:
    dst.write_text(portable(src.read_text(), out_dir))
    return dst


def _pack_status(out_dir: Path, dest: Path) -> Path:
    """grid_status.json into dest, merged with the one dest already holds (earlier sessions, other machines), so
    a pack never loses the history of the runs it already holds."""
    dest.mkdir(parents=True, exist_ok=True)
    new, old = _read_json(out_dir / "grid_status.json"), _read_json(dest / "grid_status.json")
    if new is None or old is None:  # nothing to merge with (or a file not the grid's): copied as it is
        return _copy_portable(out_dir / "grid_status.json", dest / "grid_status.json", out_dir)
    new = json.loads(portable(json.dumps(new), out_dir))
    (dest / "grid_status.json").write_text(json.dumps(merge_status(old, new), indent=1) + "\n")
    return dest / "grid_status.json"


def pack_results(out_dir: str | Path, dest: str | Path) -> list[Path]:
    """Copy what is worth committing for every finished run into dest, mirroring the layout.

    Per run: summary.json, config.yaml, eval.jsonl, environment.json and metrics.jsonl.gz (gzip, mtime 0 so the bytes
    are stable). Plus grid.yaml and grid_status.json (merged into dest's own, if it has one: earlier sessions'
    history and finished runs are kept). Never checkpoints or logs. Text files pass through
    :func:`portable`, so no machine path is packed. dest can be read by
    load_results/report, and used as `--out` of the same grid to continue it elsewhere. Returns the
    files written.
    """
    out_dir, dest = Path(out_dir), Path(dest)
    written: list[Path] = []
    if (out_dir / "grid.yaml").exists():
        dest.mkdir(parents=True, exist_ok=True)
        written.append(_copy_portable(out_dir / "grid.yaml", dest / "grid.yaml", out_dir))
    if (out_dir / "grid_status.json").exists():
        written.append(_pack_status(out_dir, dest))
    for r in find_runs(out_dir):
        if run_status(r.path) != "finished":
            continue
        target = dest / r.cell / f"lag{r.lag}" / f"seed{r.seed}"
        target.mkdir(parents=True, exist_ok=True)
        for name in PACKED_FILES:
            if (r.path / name).exists():
                written.append(_copy_portable(r.path / name, target / name, out_dir))
        mp = metrics_path(r.path)
        if mp is not None:
            gz = target / "metrics.jsonl.gz"
            if mp.suffix == ".gz":
                shutil.copyfile(mp, gz)
            else:
                with (
                    open(mp, "rb") as src,
                    open(gz, "wb") as raw,
                    gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z,
                ):
                    shutil.copyfileobj(src, z)
            written.append(gz)
    return written
