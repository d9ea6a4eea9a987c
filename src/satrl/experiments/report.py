"""The report behind `satrl report runs/NAME [--out DIR]` (its command line: `satrl.apps.report`): report.md + PNG
figures for a grid output folder.

The report is self-contained (figures in `figures/`, linked relatively) so that a folder committed
under docs/results/<grid>/ renders on GitHub. Numbers in the tables come from summary.json files
through stats.cell_stats / stats.compare; nothing is typed by hand. A grid's declared ``hypotheses:`` are
tested as one Holm family; every other comparison is listed as exploratory.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from satrl.diagnostics.summary import late_window_start
from satrl.experiments import plots
from satrl.experiments.describe import describe_md, runtime_md
from satrl.experiments.interaction import Interaction, declared, interaction_md
from satrl.experiments.leaderboard import leaderboard_md
from satrl.experiments.mdtext import _f, _md_cell, endpoints, fmt_ci
from satrl.experiments.secondary import comparisons_of, runs_md
from satrl.experiments.stats import (
    DEFAULT_INTERVAL,
    _clean,
    cell_stats,
    interval_coverage,
)
from satrl.experiments.store import GridResults, load_results
from satrl.experiments.verdicts import exploratory_md, hypotheses_md, repair_md
from satrl.folders import replacing
from satrl.provenance import git_commit

_PREFIX = {"late_test_avg_at_k": "late_test", "best_test_avg_at_k": "best_test", "final_test_avg_at_k": "final_test",
           "late_avg_at_k": "late", "best_avg_at_k": "best", "final_avg_at_k": "final"}  # fmt: skip


def _lag_text(r: pd.Series) -> str:
    if not math.isfinite(r["lag_mean"]):
        return "—"
    return f"{r['lag_mean']:.1f} [{r['lag_min']:.0f}-{r['lag_max']:.0f}]"


def lag_warnings(st: pd.DataFrame, label) -> list[str]:
    """One sentence per configured lag and realized range where the realized lag disagrees with the configured
    one by more than 1 (the largest realized lag is not within 1 of it), naming the cells."""
    bad = st[np.isfinite(st["lag_max"]) & ((st["lag_max"] - st["lag"]).abs() > 1)]
    out = []
    for (lag, lo, hi), g in bad.groupby(["lag", "lag_min", "lag_max"], sort=True):
        cells = "every cell" if len(g) == int((st["lag"] == lag).sum()) else ", ".join(label(c) for c in g["cell"])
        out.append(f"**Configured lag {lag} trained at realized lags {lo:.0f}-{hi:.0f} (mean {g['lag_mean'].mean():.1f})** "
                   f"in {cells}: more than one optimizer step per rollout batch (or another schedule), so this is "
                   "not the paper's lag n (docs/metrics.md, `lag_realized`).")  # fmt: skip
    return out


def table1(res: GridResults, st: pd.DataFrame) -> str:
    """Markdown Table 1, one row per (method, configured lag): realized lag, the endpoints with CIs,
    collapses under the eval rule, and d_pi."""
    all_ep = endpoints(res)
    ep = {k: v for k, v in all_ep.items() if k == "primary" or v != all_ep["primary"]}  # no column twice
    header = ["method", "lag", "realized lag: mean [min-max]"] + [f"{name}" for _, name in ep.values()]
    header += ["collapses (eval rule)", "d_pi (last 25%)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in res.cell_order():
        for _, r in st[st["cell"] == cell].sort_values("lag").iterrows():
            row = [_md_cell(res.label(cell)), str(r["lag"]), _lag_text(r)]
            for key, _ in ep.values():
                pre = _PREFIX[key]
                row.append(fmt_ci(r[f"{pre}_mean"], r[f"{pre}_lo"], r[f"{pre}_hi"]))
            med = f" (median step {_f(r['collapse_step_median'], '{:.0f}')})" if r["collapses"] else ""
            unc = f", {r['unconfirmed']} unconfirmed" if r["unconfirmed"] else ""
            row.append(f"{r['collapses']}/{r['n']}{med}{unc}")
            row.append(fmt_ci(r["d_pi_mean"], r["d_pi_lo"], r["d_pi_hi"], "{:.4f}", 1.0))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)




def _sat_activity_md(res: GridResults) -> list[str]:
    """How much SAT acted, per SAT cell and lag: SAT can change a gradient only when q < log(1 + eps_high),
    with each run's own eps_high (from its config.yaml)."""
    m = res.metrics
    if "obj/q" not in m or m["obj/q"].notna().sum() == 0:
        return []
    used = ["cell", "lag", "seed", "obj/q", *(k for k in ("obj/sat_clipfrac", "obj/gate_rate", "gate/tv_share") if k in m)]
    sat = m.loc[m["obj/q"].notna(), used]  # the columns read below: the row filters copy no others
    eps = res.runs.set_index(["cell", "lag", "seed"])["eps_high"] if "eps_high" in res.runs else None
    eps_of = sat.join(eps, on=["cell", "lag", "seed"])["eps_high"] if eps is not None else sat["obj/q"] * float("nan")
    radius = 1.0 + eps_of
    shown = sorted({f"{r:g}" for r in radius.dropna().unique()}) or ["(1 + eps_high)"]
    bound = f"log {shown[0]}" if len(shown) == 1 else "log(1 + eps_high)"
    out = ["## How much SAT acted", "",
           "Over all steps and seeds of each SAT cell: the median quantile q; the share of steps with q below PPO's "
           f"own radius {bound} (only then can SAT's contraction bind); the share of tokens whose gradient SAT "
           "changed (`obj/sat_clipfrac`); the gate rate; and the share of the sampled-token TV mass on gated "
           "tokens (`gate/tv_share`; equal to the gate rate for a random gate). For a proxy score or the inverted "
           f"gate, q is that score's own quantile, so the {bound} column does not apply.", "",
           f"| method | lag | median q | steps with q < {bound} | gradients changed | gate rate | TV mass on gated |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    below = sat["obj/q"] < radius.map(math.log)
    for cell in res.cell_order():
        for lag, g in sat[sat["cell"] == cell].groupby("lag"):
            mean = {k: g[k].mean() if k in g else float("nan") for k in ("obj/sat_clipfrac", "obj/gate_rate", "gate/tv_share")}
            out.append(f"| {_md_cell(res.label(cell))} | {lag} | {g['obj/q'].median():.3f} | {below[g.index].mean():.0%} "
                       f"| {mean['obj/sat_clipfrac']:.2%} | {mean['obj/gate_rate']:.1%} | {mean['gate/tv_share']:.1%} |")  # fmt: skip
    return out + [""]


# (metric, column header, format): the mismatch regime over the last 25 % of each run's steps
_REGIME_COLS = (("mismatch/d_pi", "d_pi", "{:.4f}"), ("mismatch/d_policy", "Δπ (policy lag)", "{:.4f}"),
                ("mismatch/d_impl", "Δimpl (implementation)", "{:.4f}"),
                ("mismatch/frac_impl", "implementation share", "{:.0%}"),
                ("moe/route_disagree", "routing disagreement", "{:.2%}"), ("obj/clipfrac", "total clip fraction", "{:.2%}"))  # fmt: skip


def regime_md(res: GridResults) -> list[str]:
    """The mismatch regime per method and lag: each run's mean over its last 25 % of steps, then the mean over
    seeds. Says whether the runs are in the paper's regime (d_pi ~ 0.005-0.02, implementation-dominated)."""
    m = res.metrics
    cols = [c for c in _REGIME_COLS if c[0] in m and m[c[0]].notna().any()]
    if m.empty or not cols:
        return []
    out = ["## Mismatch regime", "",
           "Per method and configured lag, over the last 25 % of each run's steps, mean over seeds: the mismatch "
           "d_pi = mean |log pi/mu| and its split into policy lag Δπ and implementation mismatch Δimpl "
           "(docs/metrics.md, `mismatch/*`), the implementation share `mismatch/frac_impl`, the MoE routing "
           "disagreement between engine and trainer, and the share of tokens any clip zeroed (`obj/clipfrac`).", "",
           "| method | lag | " + " | ".join(c[1] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]  # fmt: skip
    m = m[["cell", "lag", "seed", "step", *(c[0] for c in cols)]]  # the columns read: each filter copies no others
    for cell in res.cell_order():
        for lag, g in m[m["cell"] == cell].groupby("lag"):
            per_run = []
            for _, r in g.groupby("seed"):
                last = r[r["step"] >= late_window_start(int(r["step"].max()))]  # d_pi_last25's window
                per_run.append({c[0]: last[c[0]].mean() for c in cols})
            vals = [_f(_mean_present([x[c[0]] for x in per_run]), c[2]) for c in cols]
            out.append(f"| {_md_cell(res.label(cell))} | {lag} | " + " | ".join(vals) + " |")
    return out + [""]


def _mean_present(values) -> float:
    """Mean of the finite values; NaN (shown as a dash) when a metric is absent from every run."""
    x = _clean(values)
    return float(x.mean()) if x.size else float("nan")


def _machines_note(res: GridResults) -> list[str]:
    """One bullet: the CPU kinds the runs ran on (environment.json), since bits depend on them; none if no run
    recorded one."""
    if "machine" not in res.runs or res.runs["machine"].isna().all():
        return []
    counts = res.runs["machine"].fillna("not recorded").value_counts()
    kinds = "; ".join(f"{n} on {kind}" if kind != "not recorded" else f"{n} not recorded" for kind, n in counts.items())
    out = [f"- Machines (CPU kind per run, `environment.json`; runs are bit-identical only on one kind): {kinds}."]
    for seed, by_kind in mixed_seeds(res.runs).items():
        where = "; ".join(f"{', '.join(names)} on {kind}" for kind, names in by_kind.items())
        out.append(f"- **Seed {seed}'s paired runs ran on different CPU kinds** (every comparison pairs runs by "
                   f"seed, so its differences on this seed mix in a machine difference): {where}.")
    if len(out) > 1 and res.meta.get("hypotheses"):
        across = {n: s for n, s in hypothesis_mixed_seeds(res.runs, res.meta["hypotheses"]).items() if s}
        within = [n for n in res.meta["hypotheses"] if n not in across]
        words = [f"each pair on one kind in {', '.join(within)}"] if within else []
        words += [f"{n} pairs across kinds on seed(s) {', '.join(map(str, s))}" for n, s in across.items()]
        out.append(f"- Declared hypotheses (their own pairs only): {'; '.join(words)}.")
    return out


def _commits_note(res: GridResults) -> list[str]:
    """One bullet when the runs were made at more than one code commit (each run's ``environment.json``; a grid
    resumed with ``--allow-commit-change``, or a run resumed on a later commit): how many runs at each, and their
    cells. None for one commit, which the "Runs produced by" line names."""
    if "commit" not in res.runs or res.runs["commit"].nunique() < 2:
        return []
    runs = res.runs.assign(commit=res.runs["commit"].fillna("not recorded"))
    by = sorted(runs.groupby("commit"), key=lambda kv: (-len(kv[1]), kv[0]))
    each = "; ".join(f"{len(g)} at {c} ({', '.join(sorted(g['cell'].unique()))})" for c, g in by)
    return [f"- Code commits (per run, `environment.json`; the Runs produced by line names the last grid session's): {each}."]


def _protocol_note(res: GridResults) -> list[str]:
    """A pre-registered grid's protocol (path, commit, time, blob) and any run that started before its first commit
    (a protocol with dated sections appended after it names both commits)."""
    rec = res.meta.get("protocol_record")
    if not rec:
        return []
    from satrl.experiments.preregistration import runs_before

    dirs = {r: Path(p) for r, p in zip(res.runs["run"], res.runs["path"])} if len(res.runs) else {}
    at = f"`{rec['commit']}` ({rec['committed_at']}, blob `{rec['blob'][:12]}`)"
    changed = rec.get("added", rec["commit"]) != rec["commit"]  # dated sections appended after its first commit
    where = (f"first committed at `{rec['added']}` ({rec['added_at']}), last changed (dated sections appended) at "
             f"{at} as the last grid session read it" if changed else f"at commit {at}")  # fmt: skip
    early = runs_before(dirs, rec["added_at"] if changed else rec["committed_at"])
    first = "first " if changed else ""
    note = (f"**{len(early)} run(s) started before the protocol's {first}commit** (not governed by it): "
            f"{', '.join(early)}." if early else f"every run started after {'its first commit' if changed else 'it'}.")  # fmt: skip
    return [f"- Protocol: `{rec['path']}` {where}; {note}"]


def hypothesis_mixed_seeds(runs: pd.DataFrame, hypotheses: dict) -> dict[str, list[int]]:
    """hypothesis -> the seeds (within its ``seeds`` range) on which its method's run and a base's run ran on
    different CPU kinds; only runs that recorded a kind count. A staged trial's later cells can share seeds with
    earlier cells run elsewhere, and a test is clean when its own pairs are."""
    rec = runs.dropna(subset=["machine"]) if "machine" in runs else runs.iloc[:0]
    out = {}
    for name, h in hypotheses.items():
        lo, hi = map(int, h.get("seeds") or (-1, 10**9))
        here = rec[rec["seed"].between(lo, hi)]
        kind = {(c, int(lag)): dict(zip(g["seed"], g["machine"])) for (c, lag), g in here.groupby(["cell", "lag"])}
        out[name] = sorted({int(s) for m, b, lag, base_lag in comparisons_of(h)
                            for s, k in kind.get((b, base_lag), {}).items()
                            if kind.get((m, lag), {}).get(s, k) != k})  # fmt: skip
    return out


def mixed_seeds(runs: pd.DataFrame) -> dict[int, dict[str, list[str]]]:
    """seed -> {CPU kind: ["cell/lag<n>", ...]} for every seed whose runs (those that recorded a kind) ran on more
    than one kind. Comparisons pair runs by seed, so such a seed's differences are not purely the methods'."""
    rec = runs.dropna(subset=["machine"]) if "machine" in runs else runs.iloc[:0]
    out = {}
    for seed, g in rec.groupby("seed", sort=True):
        if g["machine"].nunique() > 1:
            out[int(seed)] = {kind: [f"{c}/lag{lag}" for c, lag in zip(k["cell"], k["lag"])]
                              for kind, k in g.groupby("machine", sort=True)}
    return out


def _progress_note(res: GridResults) -> str:
    """' **Incomplete: ...**' when fewer runs finished than the grid file plans (each cell's seeds x its lags)."""
    cells, seeds = res.meta.get("cells") or {}, res.meta.get("seeds")
    if not cells or not isinstance(seeds, int):
        return ""
    plan = {(name, lag): (c or {}).get("seeds") or seeds
            for name, c in cells.items() for lag in (c or {}).get("lags") or res.meta.get("lags") or [None]}
    planned, done = sum(plan.values()), len(res.finished)
    if done >= planned:
        return ""
    have = res.finished.groupby(["cell", "lag"])["seed"].agg(set)  # (cell, lag) -> finished seeds
    complete = int(have.map(len).min()) if len(have) == len(plan) else 0
    return (f" **Incomplete: {done} of {planned} planned runs finished** ({complete} complete seed(s) in every "
            f"cell and lag; the grid plans {seeds}): tests below use the seeds present on both sides of each "
            "comparison, and a verdict is final only at the planned seed count. Not finished: "
            f"{_missing(plan, have, int(res.meta.get('first_seed') or 0))}.")


def _missing(plan: dict, have: pd.Series, first: int) -> str:
    """'grpo/lag1 seeds 24-33; ...': each cell and lag's planned seeds (counted from the grid's first_seed) with no
    finished run, as contiguous ranges, so a reader sees whether a gap is a cell never run or a stopped grid."""
    parts = []
    for (cell, lag), n in plan.items():
        todo = [s for s in range(first, first + n) if s not in have.get((cell, lag), set())]
        # consecutive seeds share seed - position: each group is one contiguous range
        runs = (list(g) for _, g in itertools.groupby(enumerate(todo), lambda x: x[1] - x[0]))
        spans = [(g[0][1], g[-1][1]) for g in runs]
        if spans:
            where = f"{cell}/lag{lag}" if lag is not None else cell
            parts.append(f"{where} seed{'s' if len(todo) > 1 else ''} "
                         + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans))
    return "; ".join(parts[:8]) + (f"; and {len(parts) - 8} more cells" if len(parts) > 8 else "")


def _coverage_note(res: GridResults, ci: float) -> str:
    if res.finished.empty:
        return ""
    n = int(res.finished.groupby(["cell", "lag"]).size().min())
    if n < 2:
        return "With a single seed per cell there is no interval."
    normal, skewed = interval_coverage(n, DEFAULT_INTERVAL, ci), interval_coverage(n, DEFAULT_INTERVAL, ci, dist="lognormal")
    return (f"With {n} seeds per cell (the fewest) this interval covers {normal:.0%} of the time on normal data and "
            f"{skewed:.0%} on skewed (lognormal) data for a nominal {ci:.0%} (simulated: "
            f"`satrl.experiments.stats.interval_coverage({n})`; the percentile bootstrap of earlier reports covers "
            f"{interval_coverage(n, 'percentile', ci):.0%}).")  # fmt: skip


class NoRunsError(ValueError):
    """The folder holds no grid runs to report on (one line, ``satrl report`` exits 2)."""


def build_report(out_dir: str | Path, dest: str | Path | None = None, *, n_resamples: int = 10_000,
                 ci: float = 0.95, seed: int = 0, command: str | None = None,
                 sensitivity_min_seed: int | None = None,
                 sensitivity_seeds: tuple[tuple[int, int], ...] = (),
                 interactions: tuple[Interaction, ...] = (), describe: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Write dest/report.md and dest/figures/*.png for the grid in out_dir. Returns report.md's path.
    ``sensitivity_min_seed``: also test the declared hypotheses on the seeds from that one on;
    ``sensitivity_seeds``: also test them on each inclusive seed range ``(lo, hi)``, one section each;
    ``interactions``: a section each estimating a method's gain at one lag minus at another
    (:mod:`satrl.experiments.interaction`); ``describe``: training metric keys whose per-cell means get a
    section (:mod:`satrl.experiments.describe`)."""
    res = load_results(out_dir)
    if not len(res.runs):
        raise NoRunsError(f"{out_dir}: no grid runs in it (a grid's --out holds <cell>/lag<n>/seed<s>/ run folders; "
                          "a single run's numbers are its summary.json): give a grid's --out folder")  # fmt: skip
    dest = Path(dest or out_dir)
    figdir = dest / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    boot = (n_resamples, ci, seed)
    md = _header_md(res, out_dir, command, boot)
    md += _table1_md(res, cell_stats(res.runs, n_resamples, ci, seed))
    md += hypotheses_md(res, n_resamples, ci, seed)
    md += repair_md(res, n_resamples, ci, seed)
    for i, lb in enumerate(res.meta.get("leaderboards") or []):
        md += leaderboard_md(res, lb, i, figdir, n_resamples, ci, seed)
    own = declared(res.meta)  # the grid file's, then those asked for that it does not declare
    for spec in (*own, *(i for i in interactions if i not in own)):
        md += interaction_md(res, spec, endpoints(res)["primary"][0], ci, figdir, is_declared=spec in own)
    if describe:
        md += describe_md(res, describe)
    md += _sensitivity_md(res, boot, sensitivity_min_seed, sensitivity_seeds)
    explore, tables = exploratory_md(res, n_resamples, ci, seed)
    md += explore
    md += regime_md(res)
    md += _sat_activity_md(res)
    md += runtime_md(res)
    md += runs_md(res)
    md += _figures_md(res, tables, dest, figdir)
    bad = res.runs[res.runs["status"] != "finished"]
    if len(bad):
        md += (
            ["## Runs not finished", ""] + [f"- `{r}`: {s}" for r, s in zip(bad["run"], bad["status"])] + [""]
        )
    path = dest / "report.md"
    with replacing(path) as tmp:
        tmp.write_text("\n".join(md))
    return path


def _header_md(res: GridResults, out_dir: str | Path, command: str | None, boot: tuple[int, float, int]) -> list[str]:
    """The title, the commands and commits behind the report and its runs, and how its statistics are made."""
    n_resamples, ci, seed = boot
    name = res.meta.get("name") or Path(out_dir).name
    counts = res.runs["status"].value_counts().to_dict() if len(res.runs) else {}
    k = res.evals["k"].dropna().unique() if len(res.evals) else []
    md = [f"# Grid report: {name}", ""]
    if res.meta.get("description"):
        md += [str(res.meta["description"]).strip(), ""]
    md += [f"- Report: `{command or f'satrl report {out_dir}'}` at git commit `{git_commit() or 'unknown'}`, "
           f"{time.strftime('%Y-%m-%d')}.",
           f"- Runs produced by: `{' '.join(res.meta.get('command') or ['unknown'])}` at git commit "
           f"`{res.meta.get('git_commit') or 'unknown'}`.",
           f"- Runs: {', '.join(f'{v} {s}' for s, v in sorted(counts.items())) or 'none'}; "
           f"avg@k with k = {', '.join(str(int(x)) for x in k) or 'unknown'}.{_progress_note(res)}",
           *_machines_note(res),
           *_commits_note(res),
           *_protocol_note(res),
           f"- Statistics: mean over seeds and {ci:.0%} studentized bootstrap CI of the mean ({n_resamples} "
           f"resamples, seed {seed}), cut to where the mean can lie (avg@k in 0-100 %, d_pi >= 0; "
           f"`stats.within_support`): these describe each cell. {_coverage_note(res, ci)} Paired comparisons use the "
           "exact sign-flip test throughout: its p-value with Holm's correction gives the verdict, its own interval "
           "(the shifts it does not reject) and its own MDE (its simulated power) stand next to it. Collapse: the eval rule on val "
           "(`satrl.diagnostics.collapse.eval_collapse`, docs/metrics.md).", ""]  # fmt: skip
    return md


def _table1_md(res: GridResults, st: pd.DataFrame) -> list[str]:
    """Table 1 with uncertainty (or a line saying there is nothing to tabulate yet)."""
    if st.empty:
        return ["No finished runs yet: nothing to tabulate.", ""]
    md: list[str] = []
    ep = endpoints(res)
    if ep["primary"][0] == "late_avg_at_k":
        md += ["**These runs predate the val/test split**: their scores are on one set of eval problems, so "
               "the best score is selected and reported on the same problems (optimistic by the selection "
               "noise); the late-window mean needs no selection and is the endpoint to read. Their summaries "
               "were recomputed with today's rules from the runs' own files (eval-rule collapse, realized lag). "
               "They have no step-0 evaluation, so the collapse rule's base is the first eval, which makes it "
               "flag noise as collapse when the gain after that eval is small: read those counts as an upper "
               "bound.", ""]  # fmt: skip
    warnings = lag_warnings(st, res.label)
    md += ["## Table 1 with uncertainty", "",
           "One row per method and configured lag. Realized lag: token-weighted mean, min and max over the "
           "trained tokens after the first rollout batch (`lag_realized`, mean over seeds, min/max over "
           f"seeds). Primary endpoint: `{ep['primary'][0]}`, the mean over the evals in the last 25 % of "
           "steps (no selection). avg@k in %, `mean ± half-width [lo, hi]`. Collapses: runs collapsed under "
           "the eval rule, out of N, with the median step (unconfirmed: a drop the run ended inside). d_pi: "
           "mean over the run's last 25 % of steps.", "", table1(res, st), ""]  # fmt: skip
    if warnings:
        md += ["**Realized lag differs from the configured lag:**", ""] + [f"- {w}" for w in warnings] + [""]
    return md


def _sensitivity_md(res: GridResults, boot: tuple[int, float, int], min_seed: int | None,
                    seed_ranges: tuple[tuple[int, int], ...]) -> list[str]:  # fmt: skip
    """The declared hypotheses again on subsets of seeds (outside the Holm family), one section each."""
    seeds = res.runs["seed"]
    subsets = ([(f"seeds >= {min_seed}", seeds >= min_seed,
                 f"the seeds from {min_seed} on", "without seeds that earlier decisions saw")]
               if min_seed is not None else [])  # fmt: skip
    subsets += [(f"seeds {lo}-{hi}", seeds.between(lo, hi), f"seeds {lo}-{hi}", "the runs of one machine kind")
                for lo, hi in seed_ranges]  # fmt: skip
    md: list[str] = []
    for label, keep, which, example in subsets if res.meta.get("hypotheses") else ():
        md += hypotheses_md(dataclasses.replace(res, runs=res.runs[keep]), *boot,
                            f"Sensitivity: declared hypotheses on {label}",
                            f"The same tests on {which} only (a sensitivity analysis outside the Holm family above, "
                            f"e.g. {example}; see the protocol).")  # fmt: skip
    return md


def _figures_md(res: GridResults, tables: dict, dest: Path, figdir: Path) -> list[str]:
    """Draw the report's figures into ``figdir``; their section (a figure with nothing to draw says why)."""
    baseline = res.meta.get("baseline")
    figures = [plots.eval_curves(res, figdir / "eval_curves.png"), plots.d_pi_curves(res, figdir / "d_pi.png"),
               plots.sat_diagnostics(res, figdir / "sat_diagnostics.png"), plots.gate_check(res, figdir / "gate_check.png"),
               plots.bylag(res, figdir / "bylag.png"), plots.paired(res, tables, baseline, figdir / "paired.png"),
               plots.paired_curves(res, baseline, figdir / "paired_curves.png"),
               plots.dose_response(res, figdir / "dose_response.png")]  # fmt: skip
    md = ["## Figures", ""]
    for fig in figures:
        md += [f"### {fig.title}", ""]
        if fig.path is None:
            md += [f"Skipped: {fig.note}.", ""]
        else:
            md += [f"![{fig.title}]({fig.path.relative_to(dest).as_posix()})", "", f"*{fig.caption}*", ""]
    return md
