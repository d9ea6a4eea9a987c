"""What a method's controls did during training: per cell and lag, the mean of chosen training metrics.

A trial that splits a method into its controls (the vcpo_factorial protocol's "Mechanism, descriptive") reads how
each control acted, not only what it scored: how far VCPO's baseline moved from the group mean (``obj/opob_shift``),
the ESS step's lr scale (``train/lr_scale``), the update's ESS ratio (``update/ess_ratio``). Per run the mean of a
metric over every logged step (NaN steps skipped), then per cell and lag the mean over seeds with the lowest and
highest run. Descriptive: no test. ``satrl report --describe KEY[,KEY...]`` adds the section. Every report also
gets what each cell cost in run time (``runtime_md``), from the summaries.
"""

from __future__ import annotations

import math

import pandas as pd

from satrl.experiments.mdtext import _md_cell
from satrl.experiments.store import GridResults

__all__ = ["DescribeError", "describe", "describe_md", "parse_describe", "runtime", "runtime_md"]


class DescribeError(ValueError):
    """``--describe`` names a metric no run logged (one line, ``satrl report`` exits 2)."""


def parse_describe(text: str) -> tuple[str, ...]:
    """``"obj/opob_shift,train/lr_scale"`` -> the metric keys. A ValueError names what is wrong."""
    keys = tuple(k.strip() for k in text.split(","))
    if not all(keys):
        raise ValueError(f"{text!r}: expected metric keys separated by commas, e.g. obj/opob_shift,train/lr_scale")
    return keys


def describe(metrics: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """Per (cell, lag, key): n (runs that logged the key), mean over runs of each run's mean over its steps, and the
    lowest and highest run mean. Runs that never logged a key are left out of that key's row."""
    rows = []
    for (cell, lag), g in metrics.groupby(["cell", "lag"], sort=False):
        for key in keys:
            if key not in g:
                continue
            per_run = g.groupby("seed")[key].mean().dropna()  # a run's mean over its logged steps
            if len(per_run):
                rows.append((cell, lag, key, len(per_run), per_run.mean(), per_run.min(), per_run.max()))
    return pd.DataFrame(rows, columns=["cell", "lag", "key", "n", "mean", "min", "max"])


def _num(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:.4g}"


def describe_md(res: GridResults, keys: tuple[str, ...]) -> list[str]:
    """The report's section: one row per cell and lag, one column per metric ('mean (min-max over runs)')."""
    m = res.metrics
    missing = [k for k in keys if k not in m or not m[k].notna().any()]
    if missing:
        raise DescribeError(f"--describe {','.join(keys)}: no run logged {', '.join(missing)} (a metric key as in a "
                            "run's metrics.jsonl, e.g. obj/opob_shift; docs/metrics.md lists them)")  # fmt: skip
    t = describe(m, keys)
    md = ["## What the controls did (descriptive)", "",
          "Per run the mean of each training metric over every logged step (`metrics.jsonl`), then per method and "
          "configured lag the mean over runs, with the lowest and highest run in brackets; \"—\" where no run of "
          "that cell logged the metric (docs/metrics.md says what each is). No test "
          "(`satrl.experiments.describe`).", "",
          "| method | lag | runs | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---|---|---|" + "---|" * len(keys)]  # fmt: skip
    for cell in res.cell_order():
        for lag in sorted(set(t.loc[t["cell"] == cell, "lag"])):
            here = t[(t["cell"] == cell) & (t["lag"] == lag)].set_index("key")
            vals = [f"{_num(here.at[k, 'mean'])} ({_num(here.at[k, 'min'])}–{_num(here.at[k, 'max'])})"
                    if k in here.index else "—" for k in keys]  # fmt: skip
            n = int(m[(m["cell"] == cell) & (m["lag"] == lag)]["seed"].nunique())
            md.append(f"| {_md_cell(res.label(cell))} | {lag} | {n} | " + " | ".join(vals) + " |")
    return md + [""]


def runtime(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, lag) over its finished runs with a ``wall_time_s``: n, the median, fastest and slowest run in
    seconds, and the machine-hours they took (the sum: one process each)."""
    done = runs[(runs["status"] == "finished") & runs["wall_time_s"].notna()]
    t = done.groupby(["cell", "lag"], sort=False)["wall_time_s"].agg(["count", "median", "min", "max", "sum"])
    t = t.rename(columns={"count": "n"}).reset_index()
    t["hours"] = t["sum"] / 3600
    return t.drop(columns="sum")


def runtime_md(res: GridResults) -> list[str]:
    """The report's run-time section (what each method costs, descriptive); none where no run recorded its time."""
    t = runtime(res.runs)  # wall_time_s is always a column (store.SUMMARY_KEYS), NaN where a summary lacks it
    if not len(t):
        return []
    base = res.meta.get("baseline")
    medians = {(c, lag): m for c, lag, m in zip(t["cell"], t["lag"], t["median"])}
    md = ["## Run time (descriptive)", "",
          "Per method and configured lag, each finished run's wall time (`wall_time_s` in its summary.json: the "
          "seconds its process ran, summed over resumed segments): the median with the fastest and slowest run, the "
          f"ratio of its median to the base's ({_md_cell(res.label(base)) if base else 'none declared'}) at the same "
          "lag, and the machine-hours the runs took (one process each). A run's time depends on what ran beside it (the grid's "
          "`--workers`, other jobs) and on the machine (the CPU kinds above): compare cells of one grid, run "
          "together. No test.", "",
          "| method | lag | runs | median s (fastest–slowest) | × base median | machine-hours |",
          "|---|---|---|---|---|---|"]  # fmt: skip
    for cell in res.cell_order():
        for r in t[t["cell"] == cell].sort_values("lag").itertuples():
            ref = medians.get((base, r.lag))
            ratio = f"{r.median / ref:.2f}" if ref and cell != base else "—"
            md.append(f"| {_md_cell(res.label(cell))} | {r.lag} | {r.n} | {r.median:.0f} ({r.min:.0f}–{r.max:.0f})"
                      f" | {ratio} | {r.hours:.2f} |")  # fmt: skip
    return md + [""]
