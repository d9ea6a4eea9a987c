"""`satrl report runs/NAME [--out DIR]`: report.md + PNG figures for a grid output folder.

The report is self-contained (figures in `figures/`, linked relatively) so that a folder committed
under docs/results/<grid>/ renders on GitHub. Numbers in the tables come from summary.json files
through stats.cell_stats / stats.paired_table; nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from satrl.experiments import plots
from satrl.experiments.grid import _git_commit
from satrl.experiments.stats import cell_stats, paired_table, pairs_table, percentile_coverage, separated
from satrl.experiments.store import GridResults, load_results

PCT = 100.0  # avg_at_k is a fraction in [0, 1]; the report shows percentage points, as the paper does


def _f(x: float, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    return "—" if x is None or not math.isfinite(float(x)) else fmt.format(float(x) * scale)


def _md_cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def fmt_ci(mean: float, lo: float, hi: float, fmt: str = "{:.1f}", scale: float = PCT) -> str:
    """'mean ± half-width [lo, hi]' (half-width = (hi - lo) / 2; the interval itself may be asymmetric)."""
    if not math.isfinite(mean):
        return "—"
    return f"{_f(mean, fmt, scale)} ± {_f((hi - lo) / 2, fmt, scale)} [{_f(lo, fmt, scale)}, {_f(hi, fmt, scale)}]"


# Columns of Table 1: (stats prefix, header, higher is better, format, scale)
_METRICS = [("best", "best avg@k", True, "{:.1f}", PCT), ("final", "final avg@k", True, "{:.1f}", PCT),
            ("d_pi", "d_pi (last 25%)", False, "{:.4f}", 1.0)]  # fmt: skip


def _column_marks(st: pd.DataFrame, prefix: str, higher: bool, label) -> tuple[str | None, str]:
    """Which cell (if any) is bolded in this column, and the sentence explaining the decision."""
    ok = st[np.isfinite(st[f"{prefix}_mean"])]
    if len(ok) < 2:
        return None, ""
    ok = ok.sort_values(f"{prefix}_mean", ascending=not higher)
    top, second = ok.iloc[0], ok.iloc[1]
    if min(top["n"], second["n"]) < 2:
        return (
            None,
            f"{label(top['cell'])} has the best mean, but with a single seed there is no CI to separate it.",
        )
    a, b = (top[f"{prefix}_lo"], top[f"{prefix}_hi"]), (second[f"{prefix}_lo"], second[f"{prefix}_hi"])
    if separated(a, b, higher):
        return (
            top["cell"],
            f"{label(top['cell'])} is best and its CI does not overlap the runner-up's ({label(second['cell'])}).",
        )
    return None, (f"the top two, {label(top['cell'])} and {label(second['cell'])}, have overlapping CIs, "
                  "so no cell is marked best.")  # fmt: skip


def table1(res: GridResults, st: pd.DataFrame) -> tuple[str, list[str]]:
    """Markdown Table 1 (methods x lags) and the sentences about which cells are marked."""
    lags = sorted(st["lag"].unique())
    header = ["method"]
    for _, name, *_ in _METRICS[:2]:
        header += [f"{name}, lag {lag}" for lag in lags]
    header += [f"collapses, lag {lag}" for lag in lags]
    header += [f"{_METRICS[2][1]}, lag {lag}" for lag in lags]
    bold: dict[tuple[str, int, str], bool] = {}
    notes = []
    for prefix, name, higher, *_ in _METRICS:
        for lag in lags:
            cell, sentence = _column_marks(st[st["lag"] == lag], prefix, higher, res.label)
            if cell is not None:
                bold[(cell, lag, prefix)] = True
            if sentence:
                notes.append(f"Lag {lag}, {name}: {sentence}")
    rows = []
    for cell in res.cell_order():
        row = [_md_cell(res.label(cell))]
        by_lag = {int(r["lag"]): r for _, r in st[st["cell"] == cell].iterrows()}
        for prefix, _, _, fmt, scale in _METRICS[:2]:
            for lag in lags:
                r = by_lag.get(lag)
                txt = (
                    "—"
                    if r is None
                    else fmt_ci(r[f"{prefix}_mean"], r[f"{prefix}_lo"], r[f"{prefix}_hi"], fmt, scale)
                )
                if r is not None and prefix == "best" and txt != "—":
                    txt += f" ({_f(r['best_step_median'], '{:.0f}')})"
                row.append(f"**{txt}**" if bold.get((cell, lag, prefix)) else txt)
        for lag in lags:
            r = by_lag.get(lag)
            if r is None:
                row.append("—")
                continue
            med = f" (median step {_f(r['collapse_step_median'], '{:.0f}')})" if r["collapses"] else ""
            row.append(f"{r['collapses']}/{r['n']}{med}")
        for lag in lags:
            r = by_lag.get(lag)
            txt = "—" if r is None else fmt_ci(r["d_pi_mean"], r["d_pi_lo"], r["d_pi_hi"], "{:.4f}", 1.0)
            row.append(f"**{txt}**" if bold.get((cell, lag, "d_pi")) else txt)
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines), notes


def conclusion(res: GridResults, row: pd.Series, baseline: str, metric_name: str) -> str:
    """One sentence per paired comparison, positive or negative."""
    m, b = res.label(row["cell"]), res.label(baseline)
    diff = f"{row['mean'] * PCT:+.1f} points [{row['lo'] * PCT:+.1f}, {row['hi'] * PCT:+.1f}]"
    wins = f"wins {row['wins']}/{row['n']} seeds" + (f" ({row['ties']} ties)" if row["ties"] else "")
    head = f"{m} vs {b} at lag {row['lag']} ({metric_name})"
    if row["n"] < 2:
        return f"{head}: only {row['n']} shared seed(s), no uncertainty estimate; difference {row['mean'] * PCT:+.1f} points."
    if row["verdict"] == "better":
        return f"{head}: **{m} beats {b}** by {diff}, {wins}."
    if row["verdict"] == "worse":
        return f"{head}: **{m} is worse than {b}** by {diff}, {wins}."
    return f"{head}: no detectable difference, the CI includes 0: {diff}, {wins}."


def _paired_md(res: GridResults, tables: dict[str, pd.DataFrame], baseline: str) -> list[str]:
    out = []
    for metric, t in tables.items():
        name = metric.replace("_avg_at_k", " avg@k")
        out += [
            f"**{name}** (method - {res.label(baseline)}, avg@k points, 95% CI, wins = seeds where method > baseline):",
            "",
        ]
        out += ["| method | lag | difference | 95% CI | wins | verdict |", "|---|---|---|---|---|---|"]
        for _, r in t.iterrows():
            out.append(f"| {_md_cell(res.label(r['cell']))} | {r['lag']} | {r['mean'] * PCT:+.1f} | [{r['lo'] * PCT:+.1f}, "
                       f"{r['hi'] * PCT:+.1f}] | {r['wins']}/{r['n']} | {r['verdict']} |")  # fmt: skip
        out += [""] + [f"- {conclusion(res, r, baseline, name)}" for _, r in t.iterrows()] + [""]
    return out


def _pairs_md(res: GridResults, pairs: dict[str, str], n_resamples: int, ci: float, seed: int) -> list[str]:
    """The grid's named pairs (a method vs the recipe it is layered on, or vs a control), paired by seed, on
    best and final avg@k and on the late mismatch d_pi."""
    out = ["## Named pairs: each method vs its base", "",
           "The grid's `pairs:` (e.g. a method vs the recipe it is layered on, or vs a control). Paired by seed, "
           "percentile bootstrap of the mean difference (method - base): avg@k in points (wins = seeds where the "
           "method scores higher), d_pi (mean |log r| over the last 25% of steps; lower = seeds where the "
           "method's mismatch is lower).", "",
           "| method | base | lag | best avg@k: difference [95% CI] | wins | final avg@k: difference [95% CI] | wins "
           "| d_pi: difference [95% CI] | lower |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    best, final, dpi = (pairs_table(res.runs, pairs, m, n_resamples, ci, seed)
                        for m in ("best_avg_at_k", "final_avg_at_k", "d_pi_last25"))  # fmt: skip
    side = {"better": "higher", "worse": "lower"}
    for (_, b), (_, f), (_, d) in zip(best.iterrows(), final.iterrows(), dpi.iterrows()):
        cells = [f"{r['mean'] * PCT:+.1f} [{r['lo'] * PCT:+.1f}, {r['hi'] * PCT:+.1f}] ({r['verdict']})" for r in (b, f)]
        dcell = f"{d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] ({side.get(d['verdict'], d['verdict'])})"
        lower = d["n"] - d["wins"] - d["ties"]
        out.append(f"| {_md_cell(res.label(b['cell']))} | {_md_cell(res.label(b['base']))} | {b['lag']} | {cells[0]} "
                   f"| {b['wins']}/{b['n']} | {cells[1]} | {f['wins']}/{f['n']} | {dcell} | {lower}/{d['n']} |")  # fmt: skip
    n = len(best) + len(final)
    verdicts = sum(v != "no difference" for v in [*best["verdict"], *final["verdict"]])
    seeds = int(best["n"].median()) if len(best) else 0
    cover = percentile_coverage(seeds, ci)
    out += ["", f"{verdicts} of the {n} avg@k intervals exclude 0. With {seeds} seeds a nominal {ci:.0%} percentile "
            f"interval covers only {cover:.0%} of the time (simulated on normal data: "
            f"`satrl.experiments.stats.percentile_coverage({seeds})`), so about {(1 - cover) * n:.1f} would exclude 0 "
            "by chance alone if no method differed from its base.", ""]  # fmt: skip
    return out


PPO_RADIUS = math.log(1.2)  # log(1 + eps_high) at the default eps_high = 0.2


def _sat_activity_md(res: GridResults) -> list[str]:
    """How much SAT acted, per SAT cell and lag: SAT can change a gradient only when q < log(1 + eps_high)."""
    m = res.metrics
    if "obj/q" not in m or m["obj/q"].notna().sum() == 0:
        return []
    out = ["## How much SAT acted", "",
           "Over all steps and seeds of each SAT cell: the median quantile q; the share of steps with q below PPO's "
           "own radius log 1.2 (only then can SAT's contraction bind); the share of tokens whose gradient SAT "
           "changed (`obj/sat_clipfrac`); the gate rate; and the share of the sampled-token TV mass on gated "
           "tokens (`gate/tv_share`; equal to the gate rate for a random gate). For a proxy score or the inverted "
           "gate, q is that score's own quantile, so the log 1.2 column does not apply.", "",
           "| method | lag | median q | steps with q < log 1.2 | gradients changed | gate rate | TV mass on gated |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    sat = m[m["obj/q"].notna()]
    for cell in res.cell_order():
        for lag, g in sat[sat["cell"] == cell].groupby("lag"):
            mean = {k: g[k].mean() if k in g else float("nan") for k in ("obj/sat_clipfrac", "obj/gate_rate", "gate/tv_share")}
            out.append(f"| {_md_cell(res.label(cell))} | {lag} | {g['obj/q'].median():.3f} | {(g['obj/q'] < PPO_RADIUS).mean():.0%} "
                       f"| {mean['obj/sat_clipfrac']:.2%} | {mean['obj/gate_rate']:.1%} | {mean['gate/tv_share']:.1%} |")  # fmt: skip
    return out + [""]


def _coverage_note(res: GridResults, ci: float) -> str:
    if res.finished.empty:
        return ""
    n = int(res.finished.groupby(["cell", "lag"]).size().min())
    return (f"With {n} seeds per cell (the fewest) the percentile interval is too narrow: it covers about "
            f"{percentile_coverage(n, ci):.0%}, not {ci:.0%} (simulated on normal data), so read the intervals "
            "as optimistic.")  # fmt: skip


def build_report(out_dir: str | Path, dest: str | Path | None = None, *, n_resamples: int = 10_000,
                 ci: float = 0.95, seed: int = 0, command: str | None = None) -> Path:  # fmt: skip
    """Write dest/report.md and dest/figures/*.png for the grid in out_dir. Returns report.md's path."""
    res = load_results(out_dir)
    dest = Path(dest or out_dir)
    figdir = dest / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    name = res.meta.get("name") or Path(out_dir).name
    st = cell_stats(res.runs, n_resamples, ci, seed)
    counts = res.runs["status"].value_counts().to_dict() if len(res.runs) else {}
    k = res.evals["k"].dropna().unique() if len(res.evals) else []
    md = [f"# Grid report: {name}", ""]
    if res.meta.get("description"):
        md += [str(res.meta["description"]).strip(), ""]
    md += [f"- Report: `{command or f'satrl report {out_dir}'}` at git commit `{_git_commit() or 'unknown'}`, "
           f"{time.strftime('%Y-%m-%d')}.",
           f"- Runs produced by: `{' '.join(res.meta.get('command') or ['unknown'])}` at git commit "
           f"`{res.meta.get('git_commit') or 'unknown'}`.",
           f"- Runs: {', '.join(f'{v} {s}' for s, v in sorted(counts.items())) or 'none'}; "
           f"avg@k with k = {', '.join(str(int(x)) for x in k) or 'unknown'}.",
           f"- Statistics: mean over seeds and {ci:.0%} percentile bootstrap CI of the mean ({n_resamples} "
           f"resamples, seed {seed}). {_coverage_note(res, ci)} Collapse is what each run's summary.json reports "
           "(`collapse_step`).", ""]  # fmt: skip
    if st.empty:
        md += ["No finished runs yet: nothing to tabulate.", ""]
    else:
        tab, notes = table1(res, st)
        md += ["## Table 1 with uncertainty", "",
               "Rows: methods; avg@k in %, as `mean ± half-width [lo, hi] (median best step)`; collapses = runs "
               "whose summary reports a collapse, out of N finished, with the median collapse step; d_pi = the "
               "run's mean over its last 25% of steps, then mean and CI over seeds. Bold: best in its column "
               "with a CI that does not overlap the runner-up's.", "", tab, ""]  # fmt: skip
        md += [f"- {n}" for n in notes] + [""]
    baseline = res.meta.get("baseline")
    tables: dict[str, pd.DataFrame] = {}
    if baseline and not st.empty and baseline in set(res.finished["cell"]):
        tables = {
            m: paired_table(res.runs, baseline, m, n_resamples, ci, seed)
            for m in ("best_avg_at_k", "final_avg_at_k")
        }
        tables = {m: t for m, t in tables.items() if not t.empty}
        md += [f"## Paired comparisons vs {res.label(baseline)}", "",
               "Paired by seed number (runs with the same seed share the trainer's seeding), percentile "
               "bootstrap of the mean difference over seeds.", ""]  # fmt: skip
        md += (
            _paired_md(res, tables, baseline) if tables else ["No method shares seeds with the baseline.", ""]
        )
    elif baseline:
        md += [f"## Paired comparisons vs {baseline}", "", "The baseline has no finished runs yet.", ""]
    md += _sat_activity_md(res)
    pairs = res.meta.get("pairs") or {}
    if pairs and not st.empty:
        md += _pairs_md(res, pairs, n_resamples, ci, seed)
    figures = [plots.eval_curves(res, figdir / "eval_curves.png"), plots.d_pi_curves(res, figdir / "d_pi.png"),
               plots.sat_diagnostics(res, figdir / "sat_diagnostics.png"), plots.gate_check(res, figdir / "gate_check.png"),
               plots.bylag(res, figdir / "bylag.png"), plots.paired(res, tables, baseline, figdir / "paired.png")]  # fmt: skip
    md += ["## Figures", ""]
    for fig in figures:
        md += [f"### {fig.title}", ""]
        if fig.path is None:
            md += [f"Skipped: {fig.note}.", ""]
        else:
            md += [f"![{fig.title}]({fig.path.relative_to(dest).as_posix()})", "", f"*{fig.caption}*", ""]
    bad = res.runs[res.runs["status"] != "finished"]
    if len(bad):
        md += (
            ["## Runs not finished", ""] + [f"- `{r}`: {s}" for r, s in zip(bad["run"], bad["status"])] + [""]
        )
    path = dest / "report.md"
    path.write_text("\n".join(md))
    return path


def add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="grid output folder, e.g. runs/paper_table (or packed results)")
    parser.add_argument("--out", default=None, help="where report.md and figures/ go (default: run_dir)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--ci", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument(
        "--pack", default=None, help="also copy summaries/configs/evals/metrics.gz to this folder"
    )


def run_report(args: argparse.Namespace) -> int:
    if not Path(args.run_dir).is_dir():
        print(f"satrl report: no such folder {args.run_dir}; give a grid's --out folder", file=sys.stderr)
        return 2
    if args.pack:
        from satrl.experiments.store import pack_results

        pack_results(args.run_dir, args.pack)
    cmd = " ".join(["satrl", "report", str(args.run_dir)] + (["--out", str(args.out)] if args.out else []))
    path = build_report(args.run_dir, args.out, n_resamples=args.resamples, ci=args.ci, command=cmd)
    print(f"wrote {path}")
    return 0
