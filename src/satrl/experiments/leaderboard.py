"""Declared leaderboards: every method at one lag, ranked, against a base and its staleness damage.

A grid's ``leaderboards:`` (:class:`satrl.experiments.spec.LeaderboardSpec`) each become one report section and one
figure. For each cell run at the leaderboard's lag on its seeds: the endpoint's mean with its bootstrap interval
(``stats.cell_stats``), the paired difference to the base at that lag with the exact sign-flip interval
(``stats.compare``), and the repaired fraction of the base's damage from the reference lag
(``stats.repaired_fraction``, percentile bootstrap). A screen also ranks on a validation score (``select_on``):
``late_val_avg_at_k``, the late-window mean of ``val_avg_at_k`` from each run's eval log, paired with the base's,
which is what a promotion rule reads; test numbers are then shown but never ranked on. Nothing here is a declared
test: the declared ones are the grid's ``hypotheses:``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from satrl.diagnostics.summary import late_window_start
from satrl.folders import replacing

from .stats import cell_stats, compare, repaired_fraction
from .store import GridResults

PCT = 100.0
SELECT_SCORES = ("late_val_avg_at_k",)


def late_val(res: GridResults) -> dict[tuple[str, int, int], float]:
    """(cell, lag, seed) -> mean ``val_avg_at_k`` over the evaluations in the last 25 % of the run's steps."""
    out: dict[tuple[str, int, int], float] = {}
    if res.evals.empty or "val_avg_at_k" not in res.evals:
        return out
    for (cell, lag, seed), g in res.evals.groupby(["cell", "lag", "seed"]):
        last = g[g["step"] >= late_window_start(int(g["step"].max()))]
        vals = pd.to_numeric(last["val_avg_at_k"], errors="coerce").dropna()
        if len(vals):
            out[(str(cell), int(lag), int(seed))] = float(vals.mean())
    return out


def _seeds_of(frame: pd.DataFrame, seeds: tuple[int, int] | list[int] | None) -> pd.DataFrame:
    return frame if not seeds else frame[frame["seed"].between(int(seeds[0]), int(seeds[1]))]


def rows(res: GridResults, lb: dict, n_resamples: int, ci: float, seed: int) -> pd.DataFrame:
    """One row per cell at ``lb['lag']`` (the base included, its difference 0), ranked: by the paired validation
    score when ``select_on`` is set, else by the paired endpoint difference."""
    runs = _seeds_of(res.runs, lb.get("seeds"))
    runs = runs[runs["status"] == "finished"] if "status" in runs else runs
    lag, base, ref = int(lb["lag"]), lb["base"], int(lb["reference_lag"])
    endpoint = lb.get("endpoint", "late_test_avg_at_k")
    st = cell_stats(runs, n_resamples, ci, seed)
    seeds = lb.get("seeds")
    val = {k: v for k, v in late_val(res).items() if not seeds or int(seeds[0]) <= k[2] <= int(seeds[1])} \
        if lb.get("select_on") else {}  # the screen's seeds only, as its endpoint: a promotion rule names them
    base_val = {s: v for (c, g, s), v in val.items() if c == base and g == lag}
    out = []
    for cell in [c for c in res.cell_order() if ((runs["cell"] == c) & (runs["lag"] == lag)).any()]:
        one = st[(st["cell"] == cell) & (st["lag"] == lag)].iloc[0]
        row = {"cell": cell, "n": int(one["n"]), "mean": one["late_test_mean"], "lo": one["late_test_lo"],
               "hi": one["late_test_hi"], "diff": 0.0, "diff_lo": math.nan, "diff_hi": math.nan, "wins": "",
               "fraction": math.nan, "frac_lo": math.nan, "frac_hi": math.nan,
               "select": 0.0 if cell == base and base_val else math.nan}  # the base: 0 against itself  # fmt: skip
        if cell != base:
            t = compare(runs, [(cell, base, lag)], endpoint, n_resamples, ci, seed)
            if len(t):
                r = t.iloc[0]
                row.update(diff=r["mean"], diff_lo=r["lo"], diff_hi=r["hi"], wins=f"{r['wins']}/{r['n']}")
            f = repaired_fraction(runs, cell, base, lag, ref, endpoint, n_resamples, ci, seed)
            row.update(fraction=f["fraction"], frac_lo=f["lo"], frac_hi=f["hi"])
            own = {s: v for (c, g, s), v in val.items() if c == cell and g == lag and s in base_val}
            if own:
                row["select"] = float(np.mean([v - base_val[s] for s, v in own.items()]))
        out.append(row)
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    key = "select" if lb.get("select_on") else "diff"
    return frame.sort_values([key, "cell"], ascending=[False, True], na_position="last", kind="stable")


def _pts(x: float, signed: bool = False) -> str:
    if not isinstance(x, float | int) or not math.isfinite(x):
        return "—"
    return f"{x * PCT:+.1f}" if signed else f"{x * PCT:.1f}"


def _frac(x: float) -> str:
    return f"{x:+.2f}" if math.isfinite(x) else "—"


def leaderboard_md(res: GridResults, lb: dict, index: int, figdir: Path, n_resamples: int, ci: float,
                   seed: int) -> list[str]:  # fmt: skip
    """The leaderboard's section: its table, its figure and how to read them."""
    t = rows(res, lb, n_resamples, ci, seed)
    seeds = f"seeds {lb['seeds'][0]}-{lb['seeds'][1]}" if lb.get("seeds") else "all seeds"
    base, lag, ref = res.label(lb["base"]), int(lb["lag"]), int(lb["reference_lag"])
    out = [f"## Leaderboard: {lb['title']}", ""]
    if lb.get("description"):
        out += [str(lb["description"]).strip(), ""]
    out += [f"Every method at configured lag {lag} on {seeds}, endpoint `{lb.get('endpoint', 'late_test_avg_at_k')}` "
            f"(points). Score: mean [{ci:.0%} bootstrap interval]. vs {base}: the paired difference to {base} at lag "
            f"{lag} [{ci:.0%} exact sign-flip interval] and the seeds it is higher on. Repaired: the share of "
            f"{base}'s damage from lag {ref} to lag {lag} the method recovers [{ci:.0%} percentile bootstrap] "
            "(1: all of it, 0: none). Exploratory unless a declared hypothesis names it."]  # fmt: skip
    if lb.get("select_on"):
        out[-1] += (f" Ranked on the selection score: the mean paired difference in late **validation** avg@k to "
                    f"{base} (`{lb['select_on']}`), the number a promotion rule reads; test numbers are not ranked on.")
    out += [""]
    if t.empty:
        return out + ["No finished runs at this lag yet.", ""]
    head = "| rank | method | n | score | vs " + base + " | higher | repaired |"
    out += [head + (" val. selection score |" if lb.get("select_on") else ""),
            "|---" * (7 + bool(lb.get("select_on"))) + "|"]  # fmt: skip
    for i, (_, r) in enumerate(t.iterrows(), 1):
        vs = (f"{_pts(r['diff'], True)} [{_pts(r['diff_lo'], True)}, {_pts(r['diff_hi'], True)}] | {r['wins'] or '—'} | "
              f"{_frac(r['fraction'])} [{_frac(r['frac_lo'])}, {_frac(r['frac_hi'])}]")  # fmt: skip
        if r["cell"] == lb["base"]:
            vs = "(the base) | — | —"
        line = f"| {i} | {res.label(r['cell'])} | {r['n']} | {_pts(r['mean'])} [{_pts(r['lo'])}, {_pts(r['hi'])}] | {vs} |"
        out.append(line + (f" {_pts(r['select'], True)} |" if lb.get("select_on") else ""))
    refs = _references(res, lb)
    fig = plot(res, t, refs, lb, figdir / f"leaderboard_{index}.png")
    out += ["", f"![{lb['title']}]({fig.parent.name}/{fig.name})", "",
            f"*Each method's mean {lb.get('endpoint', 'late_test_avg_at_k')} at lag {lag} with its {ci:.0%} bootstrap "
            f"interval; dashed lines: {base} at lag {ref} (the repair target) and at lag {lag}.*", ""]  # fmt: skip
    return out


def _references(res: GridResults, lb: dict) -> dict[str, float]:
    runs = _seeds_of(res.runs, lb.get("seeds"))
    runs = runs[runs["status"] == "finished"] if "status" in runs else runs
    endpoint = lb.get("endpoint", "late_test_avg_at_k")
    out = {}
    for lag in (int(lb["reference_lag"]), int(lb["lag"])):
        v = pd.to_numeric(runs[(runs["cell"] == lb["base"]) & (runs["lag"] == lag)][endpoint], errors="coerce").dropna()
        if len(v):
            out[f"{res.label(lb['base'])}, lag {lag}"] = float(v.mean())
    return out


def plot(res: GridResults, t: pd.DataFrame, refs: dict[str, float], lb: dict, path: Path) -> Path:
    """Horizontal interval plot of the leaderboard, best at the top, the base's two lags as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(t) + 1.6))
    y = np.arange(len(t))[::-1]
    mean = t["mean"].to_numpy(float) * PCT
    err = np.vstack([mean - t["lo"].to_numpy(float) * PCT, t["hi"].to_numpy(float) * PCT - mean])
    ax.errorbar(mean, y, xerr=np.nan_to_num(err), fmt="o", color="C0", ecolor="C0", capsize=3)
    for (name, v), style in zip(refs.items(), ("--", ":")):
        ax.axvline(v * PCT, color="0.35", ls=style, lw=1, label=f"{name}: {v * PCT:.1f}")
    ax.set_yticks(y, [f"{res.label(c)} (n={n})" for c, n in zip(t["cell"], t["n"])])
    ax.set_xlabel(f"{lb.get('endpoint', 'late_test_avg_at_k')} (%)")
    ax.set_title(lb["title"], fontsize=10)
    if refs:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replacing(path) as tmp:  # a write cut short (a full disk) leaves no truncated figure
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
    return path
