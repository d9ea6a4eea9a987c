"""One leaderboard across testbeds: the same methods against each testbed's base, side by side.

A grid's own leaderboard (:mod:`satrl.experiments.leaderboard`) ranks one trial's cells. Whether a result holds
beyond its testbed is a question across trials: does the method that repaired staleness damage on one task and
model repair it on another? A spec (YAML, :class:`AcrossSpec`) names the testbeds (each a folder of packed grid
results, its base, the lag compared at, the reference lag that measures the base's staleness damage, the seeds)
and the methods (rows, by cell name). Per testbed, on its seeds' finished runs only: the base's damage (base at
``reference_lag`` minus at ``lag`` per seed: mean, the 95 % interval inverting the exact sign-flip test,
``significance.sign_flip_interval``, and the seeds it is positive on); per method, the paired difference to the
base at ``lag`` (``stats.paired_diff``: the same interval, the seeds higher, the exact sign-flip p) and the
repaired fraction of the damage (``stats.repaired_fraction``, percentile bootstrap with seed 0: deterministic).
Beside each damage, S·η: S the base's realized mean lag at ``lag`` (each run's ``lag_realized`` mean, averaged over
its seeds) times η its learning rate (``train.lr`` of its saved config), so testbeds sit on one axis of the
staleness–learning-rate law (stale-rollout bias O(S·η), arXiv 2607.01083).

Nothing is pooled across testbeds and nothing here is a declared test: each column is its own trial's numbers,
and a method without finished runs at a testbed's lag on its seeds is "not tested" there. ``satrl leaderboard
SPEC.yaml`` (:mod:`satrl.apps.leaderboard`) writes ``leaderboard.md`` and ``figures/leaderboard.png``; the page
holds no timestamp and no path but those the spec gives, so it regenerates byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from satrl.config_base import ConfigError
from satrl.experiments import N_RESAMPLES  # the repaired fraction's bootstrap resamples (seed 0)
from satrl.folders import replacing

from .spec import Endpoint, SeedRange
from .stats import PairedDiff, paired_diff, repaired_fraction, seed_values
from .store import LATE_EVAL_KEYS, find_runs, load_evals, load_grid_meta, load_runs, with_late_evals

PCT = 100.0
CI = 0.95  # every interval here is a 95 % one
FIGURE = Path("figures") / "leaderboard.png"
DAMAGE_ROW = "*staleness damage: the base at its reference lag − at lag*"
NOT_TESTED = ("not tested", "not tested")  # a method's two cells on a testbed without its runs


class TestbedSpec(BaseModel):
    """One testbed: a folder of packed grid results and the comparison made on it."""

    __test__ = False  # a pydantic model, not a pytest test class
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="a short id of the testbed, e.g. arithmetic")
    name: str = Field(description="its name in the table's column headers and the figure's legend")
    results: str = Field(description="the folder of packed results (grid.yaml, <cell>/lag<L>/seed<S>/), relative "
                         "to the spec file")  # fmt: skip
    trial: str = Field("", description="free text naming the trial the runs come from, shown under the table")
    base: str = Field(description="the cell every method is compared with, at `lag`")
    lag: int = Field(description="the configured lag the methods and the base are compared at")
    reference_lag: int = Field(description="the base's lag without staleness (damage: base@it - base@lag)")
    seeds: SeedRange | None = Field(None, description="inclusive seed range [first, last] used (the trial's "
                                    "declared confirmation seeds); none: every seed")  # fmt: skip


class MethodSpec(BaseModel):
    """A row of the table: a cell name as the grids spell it, and the label shown."""

    model_config = ConfigDict(extra="forbid")
    cell: str = Field(description="the method's cell name in the testbeds' grids")
    label: str = Field(description="its name in the table and the figure")


class AcrossSpec(BaseModel):
    """A leaderboard across testbeds: its title, the endpoint, the testbeds (columns) and the methods (rows)."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(description="the page's title")
    description: str = Field("", description="a paragraph under the title: what the leaderboard asks")
    endpoint: Endpoint = Field("late_test_avg_at_k", description="the summary key compared (points)")
    testbeds: list[TestbedSpec] = Field(min_length=1, description="the testbeds, in column order")
    methods: list[MethodSpec] = Field(min_length=1, description="the methods, in row order")


def _read_yaml(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not a readable YAML file ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a leaderboard spec is a YAML mapping with title, testbeds and methods")
    return raw


def load_spec(path: str | Path) -> AcrossSpec:
    """Read and validate a spec: unknown or missing fields, an unknown endpoint, a key or cell given twice and a
    results folder that does not exist are a :class:`ConfigError` naming the file and the field."""
    path = Path(path)
    try:
        spec = AcrossSpec.model_validate(_read_yaml(path))
    except ValidationError as e:
        msgs = [f"{'.'.join(str(x) for x in err['loc']) or '(spec)'}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{path}: " + "; ".join(msgs)) from None
    for field, values in (("testbeds.{}.key", [b.key for b in spec.testbeds]),
                          ("methods.{}.cell", [m.cell for m in spec.methods])):  # fmt: skip
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ConfigError(f"{path}: {field.format(i)}: {v!r} is given twice")
    for i, bed in enumerate(spec.testbeds):
        if not (path.parent / bed.results).is_dir():
            raise ConfigError(f"{path}: testbeds.{i}.results: no such folder {path.parent / bed.results}")
    return spec


@dataclass(frozen=True)
class Column:
    """One testbed's numbers: the base's damage and, per method cell, its difference and repaired fraction
    (None: not tested there)."""

    bed: TestbedSpec
    base_label: str
    damage: PairedDiff
    cells: dict[str, tuple[PairedDiff, dict] | None]
    lag_lr: tuple[float, float]  # the base's (S, η) at lag: realized mean lag, its learning rate


def lag_and_lr(runs: pd.DataFrame, cell: str, lag: int) -> tuple[float, float]:
    """(S, η) of ``cell``'s runs at ``lag``: the mean over its seeds of each run's realized mean lag, and its
    learning rate; η is NaN unless every run has the same one (S·η then has no single value)."""
    g = runs[(runs["cell"] == cell) & (runs["lag"] == lag)]  # finished runs: both columns are there
    lags = pd.to_numeric(g["lag_realized_mean"], errors="coerce")
    lrs = set(pd.to_numeric(g["lr"], errors="coerce").dropna())
    s = float(lags.mean()) if len(g) and lags.notna().all() else math.nan
    return s, (lrs.pop() if len(lrs) == 1 else math.nan)


def _finished(folder: Path, bed: TestbedSpec, endpoint: str) -> pd.DataFrame:
    """The testbed's finished runs on its seeds (with the late eval-log endpoints when one of them is compared)."""
    runs = load_runs(folder)
    if endpoint in LATE_EVAL_KEYS:
        runs = with_late_evals(runs, load_evals(folder))
    runs = runs[runs["status"] == "finished"]
    return runs[runs["seed"].between(*bed.seeds)] if bed.seeds else runs


def _seeds(bed: TestbedSpec) -> str:
    return f"seeds {bed.seeds[0]}-{bed.seeds[1]}" if bed.seeds else "all seeds"


def column(spec: AcrossSpec, i: int, root: Path, n_resamples: int = N_RESAMPLES) -> Column:
    """Testbed ``i``'s column; a base without finished runs at its lag or reference lag is a ValueError."""
    bed, ep = spec.testbeds[i], spec.endpoint
    if not find_runs(root / bed.results):
        raise ValueError(f"testbeds.{i}.results: {bed.results} holds no grid runs (<cell>/lag<n>/seed<s>/ folders): "
                         "name a grid's --out or its packed results")  # fmt: skip
    runs = _finished(root / bed.results, bed, ep)
    lags = (bed.lag, bed.reference_lag)
    at = {lag: seed_values(runs, bed.base, lag, ep) for lag in lags}
    if missing := [lag for lag in lags if not at[lag]]:
        raise ValueError(f"testbeds.{i}.base: {bed.base!r} has no finished runs at lag {missing[0]} on {_seeds(bed)} "
                         f"in {bed.results}")  # fmt: skip
    cells: dict[str, tuple[PairedDiff, dict] | None] = {}
    for m in spec.methods:
        own = seed_values(runs, m.cell, bed.lag, ep)
        rep = repaired_fraction(runs, m.cell, bed.base, *lags, ep, n_resamples, CI, 0) if own else None
        cells[m.cell] = (paired_diff(own, at[bed.lag], CI), rep) if own else None
    meta = load_grid_meta(root / bed.results).get("cells") or {}
    label = (meta.get(bed.base) or {}).get("label") or bed.base
    damage = paired_diff(at[bed.reference_lag], at[bed.lag], CI)
    return Column(bed, label, damage, cells, lag_and_lr(runs, bed.base, bed.lag))


def evaluate(spec_path: str | Path, n_resamples: int = N_RESAMPLES) -> tuple[AcrossSpec, list[Column]]:
    """The spec and its columns; a ConfigError naming the file and the field if either cannot be had (a method
    tested on no testbed included)."""
    spec = load_spec(spec_path)
    try:
        cols = [column(spec, i, Path(spec_path).parent, n_resamples) for i in range(len(spec.testbeds))]
    except ValueError as err:
        raise ConfigError(f"{spec_path}: {err}") from None
    for j, m in enumerate(spec.methods):
        if all(c.cells[m.cell] is None for c in cols):
            raise ConfigError(f"{spec_path}: methods.{j}.cell: {m.cell!r} was run on no testbed (no finished runs at "
                              "a testbed's lag on its seeds)")  # fmt: skip
    return spec, cols


def _pts(x: float) -> str:
    return f"{x * PCT:+.1f}" if math.isfinite(x) else "—"


def _frac(x: float) -> str:
    return f"{x:+.2f}" if math.isfinite(x) else "—"


def _p(p: float) -> str:
    """An exact p to 4 decimals; below 0.0001 in two significant digits, since 16 of 16 seeds (2/65536) would
    otherwise print as a p of 0."""
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def _diff(d: PairedDiff, p: bool = True) -> str:
    if d.n == 0:
        return "no shared seeds"
    return f"{_pts(d.mean)} [{_pts(d.lo)}, {_pts(d.hi)}], {d.wins}/{d.n}" + (f", p {_p(d.p)}" if p else "")


def _s_eta(lag_lr: tuple[float, float]) -> str:
    """S·η as ``S·η 16.3 × 5e-05 = 8.2e-04``; "S·η unknown" where a run lacks its realized lag or the learning rates
    differ."""
    s, eta = lag_lr
    if not (math.isfinite(s) and math.isfinite(eta)):
        return "S·η unknown"
    return f"S·η {s:.1f} × {eta:.0e} = {s * eta:.1e}"


def _repaired(r: dict) -> str:
    return f"{_frac(r['fraction'])} [{_frac(r['lo'])}, {_frac(r['hi'])}]" if r["n"] else "no shared seeds"


def _md(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def table(spec: AcrossSpec, cols: list[Column]) -> str:
    """The markdown table: the bases' damage, then one row per method; per testbed its two columns."""
    head = ["method"] + [f"{_md(c.bed.name)}: {h}" for c in cols
                         for h in (f"vs {_md(c.base_label)} at lag {c.bed.lag}", "repaired")]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    damage = [x for c in cols for x in (f"{_diff(c.damage, p=False)}; {_s_eta(c.lag_lr)}", "—")]
    lines.append(f"| {DAMAGE_ROW} | " + " | ".join(damage) + " |")
    for m in spec.methods:
        got = [c.cells[m.cell] for c in cols]
        row = [x for g in got for x in ((_diff(g[0]), _repaired(g[1])) if g else NOT_TESTED)]
        lines.append(f"| {_md(m.label)} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _how_to_read(spec: AcrossSpec, n_resamples: int) -> str:
    return (f"How to read: per testbed, **vs base at lag L** is each method's paired difference to the testbed's "
            f"base at that lag in `{spec.endpoint}`, in points: the mean over seeds [95 % interval that inverts the "
            "exact two-sided sign-flip test, `significance.sign_flip_interval`; — where it is unbounded, with 5 "
            "seeds or fewer], the seeds it is higher on / the seeds paired, and the exact sign-flip p "
            "(`significance.sign_flip_p`, uncorrected). The first row is each base's staleness damage, the base at "
            "its reference lag minus at lag, with the same interval and the seeds it is positive on, and S·η: S the "
            "base's realized mean lag at that lag (mean over its seeds), η its learning rate, the product the "
            "stale-rollout bias grows with (arXiv 2607.01083). **Repaired** "
            "is the share of that damage a method recovers, mean(method − base, at lag) / mean(base at reference "
            "lag − base at lag) over the seeds all three share (`stats.repaired_fraction`): 1 all of the damage "
            "repaired, 0 none, below 0 worse than the base, above 1 more than the damage; its interval is the 95 % "
            f"percentile bootstrap over seeds ({n_resamples} resamples, seed 0), which is unreliable when the "
            "damage's interval reaches 0 (the ratio is then unbounded). Not tested: no finished runs of the method "
            "at that testbed's lag on its seeds. Each column is its own trial's numbers: nothing is pooled across "
            "testbeds or corrected for multiplicity here; the declared tests are in the trials' reports.")  # fmt: skip


def markdown(spec: AcrossSpec, cols: list[Column], spec_path: str, n_resamples: int) -> str:
    """The whole page: title, description, how to read, the table, the figure, the testbeds and the command."""
    desc = " ".join(spec.description.split())
    out = [f"# {spec.title}", ""] + ([desc, ""] if desc else [])
    out += [_how_to_read(spec, n_resamples), "", table(spec, cols).rstrip("\n"), ""]
    out += [f"![{spec.title}]({FIGURE.as_posix()})", "",
            "*Each method's repaired fraction per testbed with its 95 % percentile bootstrap interval; lines at 0 "
            "(none of the damage repaired) and 1 (all of it).*", "", "Testbeds:", ""]  # fmt: skip
    for c in cols:
        b = c.bed
        trial = f" {_md(b.trial)}." if b.trial else ""
        rel = "" if Path(b.results).is_absolute() else " (relative to the spec)"
        out.append(f"- **{_md(b.name)}** (`{b.key}`):{trial} Runs: `{b.results}`{rel}, "
                   f"{_seeds(b)}; base {_md(c.base_label)} (`{b.base}`) at lag {b.lag}, damage from lag "
                   f"{b.reference_lag}.")  # fmt: skip
    flags = f" --resamples {n_resamples}" if n_resamples != N_RESAMPLES else ""
    return "\n".join(out + ["", f"Regenerate: `satrl leaderboard {spec_path}{flags}`", ""])


def plot(spec: AcrossSpec, cols: list[Column], path: Path) -> Path:
    """Repaired fraction per method (rows, the spec's order from the top) with its interval, the testbeds side by
    side within a row; lines at 0 and 1. A PNG without the software's version, so it depends on the data alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(cols)
    fig, ax = plt.subplots(figsize=(7.5, (0.3 + 0.2 * k) * len(spec.methods) + 1.6))
    y, step = np.arange(len(spec.methods))[::-1].astype(float), 0.7 / k
    for i, c in enumerate(cols):
        got = [(y[j] + (k - 1) / 2 * step - i * step, c.cells[m.cell][1]) for j, m in enumerate(spec.methods)
               if c.cells[m.cell] is not None and math.isfinite(c.cells[m.cell][1]["fraction"])]  # fmt: skip
        if not got:
            continue
        x = np.array([r["fraction"] for _, r in got])
        err = np.vstack([x - [r["lo"] for _, r in got], np.array([r["hi"] for _, r in got]) - x])
        ax.errorbar(x, [yy for yy, _ in got], xerr=np.nan_to_num(np.maximum(err, 0.0), nan=0.0), fmt="o",
                    color=f"C{i}", capsize=3, label=c.bed.name)  # fmt: skip
    ax.axvline(0.0, color="0.35", ls="--", lw=1)
    ax.axvline(1.0, color="0.35", ls=":", lw=1)
    ax.set_yticks(y, [m.label for m in spec.methods])
    ax.set_xlabel(f"repaired fraction of the base's staleness damage ({spec.endpoint})")
    ax.set_title(spec.title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replacing(path) as tmp:  # a write cut short (a full disk) leaves no truncated figure
            fig.savefig(tmp, dpi=110, metadata={"Software": None})
    finally:
        plt.close(fig)
    return path


def leaderboard_table(spec_path: str | Path, n_resamples: int = N_RESAMPLES) -> str:
    """Just the markdown table of the spec at ``spec_path`` (what a README copies)."""
    return table(*evaluate(spec_path, n_resamples))


def build_leaderboard(spec_path: str | Path, out: str | Path | None = None, n_resamples=N_RESAMPLES) -> Path:
    """Write ``<out>/leaderboard.md`` and ``<out>/figures/leaderboard.png`` (default ``out``: the spec's folder);
    returns the markdown's path. ``spec_path`` is shown as given in the page's Regenerate line."""
    spec, cols = evaluate(spec_path, n_resamples)
    out = Path(spec_path).parent if out is None else Path(out)
    plot(spec, cols, out / FIGURE)
    with replacing(md := out / "leaderboard.md") as tmp:
        tmp.write_text(markdown(spec, cols, str(spec_path), n_resamples))
    return md
