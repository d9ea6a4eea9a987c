"""The report's figures (matplotlib, Agg). Each function writes one PNG and returns a FigureOut.

A figure whose data is absent (no SAT cells, no `gate/tv_share`, no `bylag/*` keys, no baseline)
returns FigureOut(path=None, note=why) instead of raising. Bands are per-step percentile
bootstraps over seeds (stats.bootstrap_curve); faint lines are individual seeds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from satrl.experiments.stats import bootstrap_curve  # noqa: E402
from satrl.experiments.store import GridResults  # noqa: E402
from satrl.folders import replacing  # noqa: E402

CURVE_RESAMPLES = 2_000
_BYLAG_RE = re.compile(r"^bylag/(-?\d+)/(clipfrac|gate_rate)$")


@dataclass(frozen=True)
class FigureOut:
    title: str
    caption: str
    path: Path | None = None
    note: str | None = None  # why the figure was skipped


def _err(center, lo, hi) -> np.ndarray:
    """Error-bar lengths [2, n]; clipped at 0 (float rounding can put a CI end a hair past the mean)."""
    c, lo, hi = (np.asarray(a, dtype=float) for a in (center, lo, hi))
    err = np.maximum(np.stack([c - lo, hi - c]), 0.0)
    return np.where(np.isfinite(err), err, 0.0)  # an unbounded interval (too few seeds to reject): no bar


def _colors(cells: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(cells) <= 10 else "tab20")
    return {c: cmap(i % cmap.N) for i, c in enumerate(cells)}


def _legend_right(fig: plt.Figure, axes) -> None:
    """One legend for the whole figure, right of its axes, each label once (a curve's ``(n=...)`` suffix dropped)."""
    handles = {h.get_label().split(" (n=")[0]: h for ax in axes for h in ax.get_lines()
               if not h.get_label().startswith("_")}  # fmt: skip
    fig.legend(list(handles.values()), list(handles.keys()), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def _save(fig: plt.Figure, path: Path, title: str | None = None) -> None:
    """Give the figure its title (and lay it out), write it at 110 dpi cropped to what is drawn, and close it."""
    if title is not None:
        fig.suptitle(title)
        fig.tight_layout()
    try:
        with replacing(path) as tmp:  # a write cut short (a full disk) leaves no truncated figure
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)


def _seed_matrix(df: pd.DataFrame, key: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one (cell, lag): steps [S], values [n_seeds, S] (NaN where a seed lacks a step)."""
    wide = df.pivot_table(index="seed", columns="step", values=key, aggfunc="mean").sort_index(axis=1)
    if smooth > 1:
        wide = wide.T.rolling(smooth, min_periods=1).mean().T
    return wide.columns.to_numpy(dtype=float), wide.to_numpy(dtype=float)


def _smooth_window(df: pd.DataFrame) -> int:
    n_steps = df["step"].nunique() if len(df) else 0
    return max(1, n_steps // 50)


def _smooth_text(w: int) -> str:
    return "no smoothing" if w <= 1 else f"rolling mean over {w} steps"


def _curves(ax, df: pd.DataFrame, key: str, cells: list[str], colors, labels, scale=1.0, smooth=1, suffix=""):
    drew = False
    for cell in cells:
        sub = df[df["cell"] == cell]
        if sub.empty or key not in sub or sub[key].notna().sum() == 0:
            continue
        steps, vals = _seed_matrix(sub.dropna(subset=[key]), key, smooth)
        for row in vals:
            ax.plot(steps, row * scale, color=colors[cell], alpha=0.18, lw=0.7)
        mean, lo, hi = bootstrap_curve(vals, n_resamples=CURVE_RESAMPLES)
        ax.plot(
            steps, mean * scale, color=colors[cell], lw=1.8, label=f"{labels(cell)}{suffix} (n={len(vals)})"
        )
        ax.fill_between(steps, lo * scale, hi * scale, color=colors[cell], alpha=0.2, lw=0)
        drew = True
    return drew


def _per_lag_figure(res: GridResults, df: pd.DataFrame, key: str, path: Path, title: str, ylabel: str,
                    scale: float = 1.0, smooth: int = 1, cells: list[str] | None = None) -> bool:  # fmt: skip
    cells = cells or res.cell_order()
    lags = sorted(df["lag"].unique()) if len(df) else []
    if not lags or key not in df or df[key].notna().sum() == 0:
        return False
    df = df[["cell", "lag", "seed", "step", key]]  # the columns drawn: each panel's filter copies no others
    colors = _colors(res.cell_order())
    fig, axes = plt.subplots(1, len(lags), figsize=(5.5 * len(lags), 4.2), sharey=True, squeeze=False)
    for ax, lag in zip(axes[0], lags):
        _curves(ax, df[df["lag"] == lag], key, cells, colors, res.label, scale, smooth)
        ax.set_title(f"lag {lag}")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    _legend_right(fig, axes[0])
    _save(fig, path, title)
    return True


def eval_curves(res: GridResults, path: Path) -> FigureOut:
    test = "test_avg_at_k" in res.evals and res.evals["test_avg_at_k"].notna().any()
    key, what = ("test_avg_at_k", "test-part") if test else ("avg_at_k", "all eval problems (runs without a val/test split)")
    title = "Evaluation avg@k over training"
    caption = (f"Eval avg@k (%) on the {what} problems per method, one panel per configured lag. Thick line: mean "
               "over seeds; band: 95% percentile bootstrap over seeds at each eval step; faint lines: individual "
               "seeds. Look for methods whose band stays high late in training, and for seeds that fall off "
               "(collapse).")  # fmt: skip
    ok = _per_lag_figure(res, res.evals, key, path, title, "avg@k (%)", scale=100.0)
    return FigureOut(title, caption, path if ok else None, None if ok else "no eval.jsonl data")


def d_pi_curves(res: GridResults, path: Path) -> FigureOut:
    title = "Sampled mismatch d_pi over training (Figure 4 analogue)"
    w = _smooth_window(res.metrics)
    caption = (f"d_pi = mean |log pi_train - log mu| over active tokens (`mismatch/d_pi`; {_smooth_text(w)}, "
               "applied per seed), then mean and 95% bootstrap band over seeds. Lower is closer to on-policy; a late sharp "
               "rise is the collapse signature the paper describes.")  # fmt: skip
    ok = _per_lag_figure(res, res.metrics, "mismatch/d_pi", path, title, "d_pi", smooth=w)
    return FigureOut(title, caption, path if ok else None, None if ok else "no `mismatch/d_pi` in metrics")


def _sat_cells(res: GridResults) -> list[str]:
    m = res.metrics
    if "obj/gate_rate" not in m:
        return []
    has = m.groupby("cell")["obj/gate_rate"].apply(lambda s: s.notna().any())
    return [c for c in res.cell_order() if has.get(c, False)]


def sat_diagnostics(res: GridResults, path: Path) -> FigureOut:
    title = "SAT diagnostics over training"
    keys = [("obj/gate_rate", "gate rate"), ("obj/eps_low_mean", "mean effective eps_low"),
            ("obj/eps_high_mean", "mean effective eps_high"), ("obj/q", "quantile q")]  # fmt: skip
    w = _smooth_window(res.metrics)
    caption = (f"For SAT cells only: gate rate (share of active tokens with |d| > q), mean effective radii "
               f"`eps_low*c_low` and `eps_high*c_high`, and the microbatch quantile q; {_smooth_text(w)}, "
               "lines per method and lag, band = 95% bootstrap over seeds. Look for radii that shrink as lag grows "
               "and a gate rate near 1 - alpha.")  # fmt: skip
    cells = _sat_cells(res)
    if not cells:
        return FigureOut(title, caption, None, "no SAT cells (no `obj/gate_rate` in metrics)")
    drawn = ["cell", "lag", "seed", "step", *(k for k, _ in keys if k in res.metrics)]  # no other column copied
    m = res.metrics.loc[res.metrics["cell"].isin(cells), drawn].copy()
    m["cell_lag"] = m["cell"].map(res.label) + " @lag" + m["lag"].astype(str)
    order = list(dict.fromkeys(m.sort_values(["lag"], kind="stable")["cell_lag"]))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    colors = _colors(order)
    mm = m.drop(columns=["cell"]).rename(columns={"cell_lag": "cell"})
    for ax, (key, name) in zip(axes.ravel(), keys):
        if key in mm and mm[key].notna().any():
            _curves(ax, mm, key, order, colors, lambda c: c, smooth=w)
        else:
            ax.text(0.5, 0.5, f"no `{key}` logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    _legend_right(fig, axes.ravel())
    _save(fig, path, title)
    return FigureOut(title, caption, path)


def gate_check(res: GridResults, path: Path) -> FigureOut:
    title = "Gate check: share of sampled-token TV mass on gated tokens vs gate rate"
    caption = ("Each faint point is one run (means over its steps); the large marker is the mean over seeds with "
               "the seed range as error bars. x: gate rate (share of tokens gated), y: share of the sampled-token "
               "TV mass 1/2|pi - mu| that falls on gated tokens (`gate/tv_share`). On the dashed y = x line the gate "
               "is no better than picking tokens at random; above it the gate picks the tokens that carry the "
               "mismatch. The inverted gate (falsifier) should fall below the line.")  # fmt: skip
    m = res.metrics
    if "gate/tv_share" not in m or "obj/gate_rate" not in m:
        return FigureOut(title, caption, None, "no `gate/tv_share` or `obj/gate_rate` in metrics")
    per_run = (
        m.groupby(["cell", "lag", "seed"])[["obj/gate_rate", "gate/tv_share"]].mean().dropna().reset_index()
    )
    per_run = per_run[per_run["obj/gate_rate"] > 0]
    if per_run.empty:
        return FigureOut(title, caption, None, "no run with a nonzero gate rate and a TV share")
    cells = [c for c in res.cell_order() if c in set(per_run["cell"])]
    colors, markers = _colors(res.cell_order()), "osD^v<>ph*"
    lags = sorted(per_run["lag"].unique())
    fig, ax = plt.subplots(figsize=(7, 6))
    for cell in cells:
        for j, lag in enumerate(lags):
            g = per_run[(per_run["cell"] == cell) & (per_run["lag"] == lag)]
            if g.empty:
                continue
            x, y = g["obj/gate_rate"].to_numpy(), g["gate/tv_share"].to_numpy()
            ax.scatter(x, y, color=colors[cell], alpha=0.25, s=14, marker=markers[j % len(markers)])
            xm, ym = x.mean(), y.mean()
            ax.errorbar(xm, ym, xerr=_err([xm], [x.min()], [x.max()]), yerr=_err([ym], [y.min()], [y.max()]),
                        color=colors[cell], marker=markers[j % len(markers)], ms=8, capsize=3,
                        label=f"{res.label(cell)} @lag{lag}")  # fmt: skip
    hi = max(1e-3, float(per_run[["obj/gate_rate", "gate/tv_share"]].to_numpy().max()) * 1.1)
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="y = x (no better than chance)")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, min(1.0, hi * 1.5) if hi < 1 else hi)
    ax.set_xlabel("gate rate (share of active tokens gated)")
    ax.set_ylabel("gate/tv_share (share of TV mass on gated tokens)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, path)
    return FigureOut(title, caption, path)


def bylag(res: GridResults, path: Path) -> FigureOut:
    title = "Clip fraction and gate rate by realized lag"
    caption = ("Per method and configured lag, the mean over steps and seeds of `bylag/<k>/clipfrac` and "
               "`bylag/<k>/gate_rate`: x is the realized lag k of the tokens (trainer version - sample version). "
               "SAT should gate and clip older tokens more; a fixed PPO clip has no reason to.")  # fmt: skip
    m = res.metrics
    cols = {c: _BYLAG_RE.match(c) for c in m.columns}
    cols = {c: (int(mt.group(1)), mt.group(2)) for c, mt in cols.items() if mt}
    if not cols:
        return FigureOut(title, caption, None, "no `bylag/<k>/...` keys in metrics")
    means = m.groupby(["cell", "lag"])[list(cols)].mean()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), squeeze=False)
    colors = _colors(res.cell_order())
    styles = ["-", "--", ":", "-."]
    lag_list = sorted(m["lag"].unique())
    for ax, metric in zip(axes[0], ("clipfrac", "gate_rate")):
        ks = sorted({k for k, name in cols.values() if name == metric})
        for (cell, lag), row in means.iterrows():
            y = np.array([row.get(f"bylag/{k}/{metric}", np.nan) for k in ks], dtype=float)
            if not np.isfinite(y).any() or (metric == "gate_rate" and np.nanmax(y) == 0):
                continue
            ax.plot(ks, y, marker="o", ms=3, color=colors[cell], ls=styles[lag_list.index(lag) % len(styles)],
                    label=f"{res.label(cell)} @lag{lag}")  # fmt: skip
        ax.set_xlabel("realized lag k (optimizer steps)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(f"{metric.replace('_', ' ')} by lag")
        ax.grid(alpha=0.3)
    _legend_right(fig, axes[0])
    _save(fig, path, title)
    return FigureOut(title, caption, path)


def dose_response(res: GridResults, path: Path) -> FigureOut:
    """Score and mismatch against the configured lag, for every cell run at three lags or more."""
    title = "Dose-response: endpoint and d_pi against the lag"
    key = "late_test_avg_at_k" if res.finished.get("late_test_avg_at_k", pd.Series(dtype=float)).notna().any() else "late_avg_at_k"
    caption = (f"Per cell run at three or more configured lags: `{key}` (left, %) and `d_pi_last25` (right) against "
               "the configured lag (log scale), mean over seeds with the 95% studentized interval when there are "
               "two or more seeds. Staleness damage is a score that falls as the lag grows.")  # fmt: skip
    from satrl.experiments.stats import mean_ci

    fin = res.finished
    cells = [c for c in res.cell_order() if fin[fin["cell"] == c]["lag"].nunique() >= 3]
    if not cells or key not in fin:
        return FigureOut(title, caption, None, "no cell was run at three or more lags")
    colors = _colors(res.cell_order())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    for ax, (col, scale, name) in zip(axes[0], ((key, 100.0, key + " (%)"), ("d_pi_last25", 1.0, "d_pi (last 25%)"))):
        for cell in cells:
            g = fin[fin["cell"] == cell]
            lags = sorted(g["lag"].unique())
            stats = np.array([mean_ci(pd.to_numeric(g[g["lag"] == lag][col], errors="coerce"), n_resamples=2000)
                              for lag in lags]) * scale  # fmt: skip
            ax.errorbar(lags, stats[:, 0], yerr=_err(stats[:, 0], stats[:, 1], stats[:, 2]), marker="o",
                        capsize=3, color=colors[cell], label=res.label(cell))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("configured lag n (optimizer steps)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _save(fig, path, title)
    return FigureOut(title, caption, path)


def paired_eval_diffs(evals: pd.DataFrame, key: str, baseline: str) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """(cell, lag) -> (steps [S], method - baseline per seed [n, S]) over the seeds and eval steps that both
    have; a seed missing an eval step on either side is left out of that (cell, lag), so every row is paired."""
    wide = evals.pivot_table(index=["lag", "seed", "step"], columns="cell", values=key, aggfunc="mean")
    out = {}
    for cell in wide.columns:
        if cell == baseline or baseline not in wide:
            continue
        for lag, d in (wide[cell] - wide[baseline]).groupby(level="lag"):
            d = d.droplevel("lag").unstack("step").sort_index(axis=1).dropna()
            if not d.empty:
                out[cell, int(lag)] = d.columns.to_numpy(dtype=float), d.to_numpy(dtype=float)
    return out


def paired_curves(res: GridResults, baseline: str | None, path: Path) -> FigureOut:
    """Small multiples, one panel per method: its per-seed difference to ``baseline`` at every eval step."""
    from satrl.diagnostics.summary import late_window_start

    base = res.label(baseline) if baseline else None
    title = f"Paired difference vs {base} over training"
    caption = (f"One panel per method: test avg@k of the method minus {base}'s, paired by seed at every eval step "
               "(avg@k points). Thick line: mean over the shared seeds; band: 95% percentile bootstrap over them; "
               "colour: configured lag. Shaded: the late window whose mean is the primary endpoint. Pairing by seed "
               "removes the prompt-order noise the runs share, so differences of a point or two that the "
               "all-methods curves hide show here; above 0 is better than the baseline.")  # fmt: skip
    ev = res.evals
    key = "test_avg_at_k" if "test_avg_at_k" in ev and ev["test_avg_at_k"].notna().any() else "avg_at_k"
    cells = [c for c in res.cell_order() if c != baseline]
    if baseline is None or key not in ev or ev.empty or baseline not in set(ev["cell"]) or not cells:
        return FigureOut(title, caption, None, "no baseline cell, or no eval data")
    diffs = paired_eval_diffs(ev, key, baseline)
    cells = [c for c in cells if any(c == cell for cell, _ in diffs)]  # no panel for a cell without shared seeds
    if not cells:
        return FigureOut(title, caption, None, "no method shares seeds and eval steps with the baseline")
    lags = sorted({lag for _, lag in diffs})
    lag_colors = {lag: plt.get_cmap("viridis")(i / max(1, len(lags) - 1) * 0.85) for i, lag in enumerate(lags)}
    ncol = min(3, len(cells))
    nrow = -(-len(cells) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 2.9 * nrow), sharex=True, sharey=True, squeeze=False)
    last = int(ev["step"].max())
    for ax, cell in zip(axes.flat, cells):
        ax.axhline(0, color="k", lw=0.8)
        ax.axvspan(late_window_start(last), last, color="0.9", lw=0)
        for lag in lags:
            if (cell, lag) not in diffs:
                continue
            steps, vals = diffs[cell, lag]
            vals = vals * 100.0
            mean, lo, hi = bootstrap_curve(vals, n_resamples=CURVE_RESAMPLES)
            ax.plot(steps, mean, color=lag_colors[lag], lw=1.8, label=f"lag {lag} (n={len(vals)})")
            ax.fill_between(steps, lo, hi, color=lag_colors[lag], alpha=0.2, lw=0)
        ax.set_title(res.label(cell), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"method - {base} (points)")
    _save(fig, path, title)
    return FigureOut(title, caption, path)


def paired(res: GridResults, tables: dict[str, pd.DataFrame], baseline: str | None, path: Path) -> FigureOut:
    base = res.label(baseline) if baseline else None
    title = f"Paired difference vs {base}"
    caption = (f"Each row is a method at one lag: mean over shared seeds of (method - {base}) in avg@k points, "
               "with the exact sign-flip test's 95% interval (the shifts it does not reject; no bar where too few "
               "seeds make it unbounded), and wins = seeds where the method beats the "
               "baseline. Green/red: better/worse by the Holm-corrected sign-flip test; grey: no detectable "
               "difference at this power (the colour never comes from the CI alone).")  # fmt: skip
    if baseline is None or not tables or all(t.empty for t in tables.values()):
        return FigureOut(title, caption, None, "no baseline cell, or no method shares seeds with it")
    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 0.45 * max(len(t) for t in tables.values()) + 1.8),
                             squeeze=False)  # fmt: skip
    for ax, (metric, t) in zip(axes[0], tables.items()):
        t = t.iloc[::-1].reset_index(drop=True)
        y = np.arange(len(t))
        color = t["verdict"].map({"better": "tab:green", "worse": "tab:red"}).fillna("tab:gray").to_numpy()
        err = _err(t["mean"] * 100, t["lo"] * 100, t["hi"] * 100)
        for i in range(len(t)):  # one call per row: errorbar takes a single colour
            ax.errorbar(
                t["mean"].iloc[i] * 100, y[i], xerr=err[:, i : i + 1], fmt="o", color=color[i], capsize=3
            )
        ax.axvline(0, color="k", lw=1)
        ax.set_yticks(y, [f"{res.label(c)} @lag{lag}  ({w}/{n} wins)" for c, lag, w, n in
                          zip(t["cell"], t["lag"], t["wins"], t["n"])], fontsize=8)  # fmt: skip
        name = metric.replace("_avg_at_k", " avg@k")
        ax.set_xlabel(f"{name}: method - {base} (avg@k points)")
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="x")
    _save(fig, path, title)
    return FigureOut(title, caption, path)


def interaction_plot(per_seed: pd.DataFrame, lags: tuple[int, int], labels: tuple[str, str], ci: dict,
                     path: Path) -> FigureOut:  # fmt: skip
    """A factorial's interaction (``interaction.interaction``'s result): per seed the method's gain over the base at
    the reference lag and at the lag, joined by a faint line (its slope is that seed's I), with each gain's mean
    and sign-flip interval (``ci``: ``gain_ref_`` and ``gain_lag_`` mean/lo/hi, fractions)."""
    (lag, ref), (m, b) = lags, labels
    title = f"Interaction: {m} − {b}, lag {ref} and lag {lag}"
    caption = (f"Per seed (faint lines) {m}'s gain over {b} in points without staleness (lag {ref}) and with it "
               f"(lag {lag}); a line that rises is a seed whose gain is larger with staleness (I > 0). Black: the "
               "mean gain with its sign-flip interval.")  # fmt: skip
    if per_seed.empty:
        return FigureOut(title, caption, note="no seed has all four runs")
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    for g_ref, g_lag in zip(per_seed["gain_ref"], per_seed["gain_lag"]):
        ax.plot([0, 1], [g_ref * 100, g_lag * 100], color="tab:blue", alpha=0.35, lw=1, marker="o", ms=3)
    means = np.array([ci["gain_ref_mean"], ci["gain_lag_mean"]])
    err = _err(means, [ci["gain_ref_lo"], ci["gain_lag_lo"]], [ci["gain_ref_hi"], ci["gain_lag_hi"]])
    ax.errorbar([0, 1], means * 100, yerr=err * 100, color="black", marker="s", capsize=4, lw=2)
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([0, 1], [f"lag {ref}", f"lag {lag}"])
    ax.set_xlim(-0.3, 1.3)
    ax.set_ylabel("gain over the base (points)")
    _save(fig, path, f"Interaction, lag {ref} and lag {lag}:\n{m} − {b}")
    return FigureOut(title, caption, path=path)
