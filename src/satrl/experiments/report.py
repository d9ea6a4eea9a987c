"""`satrl report runs/NAME [--out DIR]`: report.md + PNG figures for a grid output folder.

The report is self-contained (figures in `figures/`, linked relatively) so that a folder committed
under docs/results/<grid>/ renders on GitHub. Numbers in the tables come from summary.json files
through stats.cell_stats / stats.compare; nothing is typed by hand. A grid's declared ``hypotheses:`` are
tested as one Holm family; every other comparison is listed as exploratory.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from satrl.diagnostics.summary import late_window_start
from satrl.experiments import plots
from satrl.experiments.leaderboard import leaderboard_md
from satrl.experiments.stats import (
    DEFAULT_INTERVAL,
    NO_DIFFERENCE,
    _clean,
    cell_stats,
    compare,
    family_mde,
    holm,
    interval_coverage,
    iut_mde,
    iut_row,
    lag_table,
    paired_table,
    pairs_table,
    repaired_fraction,
    verdict_words,
)
from satrl.experiments.store import GridResults, load_results
from satrl.provenance import git_commit

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
    if not (math.isfinite(lo) and math.isfinite(hi)):  # one or two seeds: a mean without an interval, not "± 0"
        return f"{_f(mean, fmt, scale)} (no interval)"
    return f"{_f(mean, fmt, scale)} ± {_f((hi - lo) / 2, fmt, scale)} [{_f(lo, fmt, scale)}, {_f(hi, fmt, scale)}]"


def endpoints(res: GridResults) -> dict[str, tuple[str, str]]:
    """Which summary keys the report uses, with their names: the primary endpoint (late-window test mean,
    no selection), the val-selected best on test, and the final test score. Runs made before the val/test
    split have only pooled scores: then the late-window mean of the pooled score, and the best pooled score
    (selected on the same problems it is reported on: optimistic, said in the name)."""
    have = lambda k: k in res.finished and pd.to_numeric(res.finished[k], errors="coerce").notna().any()  # noqa: E731
    if have("late_test_avg_at_k"):
        return {"primary": ("late_test_avg_at_k", "late test avg@k"),
                "best": ("best_test_avg_at_k", "test avg@k at the val-best step"),
                "final": ("final_test_avg_at_k", "final test avg@k")}  # fmt: skip
    return {"primary": ("late_avg_at_k", "late avg@k (all eval problems)"),
            "best": ("best_avg_at_k", "best avg@k (selected on itself: optimistic)"),
            "final": ("final_avg_at_k", "final avg@k")}  # fmt: skip


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


def rules_out(lo: float, hi: float, ci: float = 0.95, lower_better: bool = False) -> str:
    """What the sign-flip interval [lo, hi] of a paired difference (method - base) excludes, in words: 'rules out
    a gain larger than X points and a loss larger than Y points' (for d_pi, lower is better: a reduction / an
    increase). This replaces a post-hoc power argument: the interval says which effects the data exclude."""
    scale, fmt, unit = (1.0, "{:.4f}", "") if lower_better else (PCT, "{:.1f}", " points")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return (f"The test's {ci:.0%} interval is unbounded: with this few seeds it cannot reject any shift, so "
                "the data rule out nothing.")
    up, down = ("an increase", "a reduction") if lower_better else ("a gain", "a loss")
    v = lambda x: f"{fmt.format(abs(x) * scale)}{unit}"  # noqa: E731
    top = f"{up} larger than {v(hi)}" if hi >= 0 else f"any {up.split()[1]} (and {down} smaller than {v(hi)})"
    bottom = f"{down} larger than {v(lo)}" if lo <= 0 else f"any {down.split()[1]} (and {up} smaller than {v(lo)})"
    first, second = (bottom, top) if lower_better else (top, bottom)
    return f"The sign-flip test's {ci:.0%} interval rules out {first}, and {second}."


def _verdict_sentence(res: GridResults, r: pd.Series, what: str, lower_better: bool = False, ci: float = 0.95) -> str:
    m, b = res.label(r["cell"]), res.label(r["base"])
    scale, fmt = (1.0, "{:+.4f}") if lower_better else (PCT, "{:+.1f}")
    unit = "" if lower_better else " points"
    diff = f"{fmt.format(r['mean'] * scale)}{unit} [{fmt.format(r['lo'] * scale)}, {fmt.format(r['hi'] * scale)}]"
    ruled = rules_out(r["lo"], r["hi"], ci, lower_better)
    stats = (f"sign-flip p = {r['p']:.3g}, Holm p = {r['p_holm']:.3g}, n = {r['n']} seeds, MDE "
             f"{'inf' if not math.isfinite(r['mde']) else fmt.format(r['mde'] * scale).lstrip('+')}{unit}")  # fmt: skip
    head = f"{m} vs {b} at lag {r['lag']} ({what})"
    if r["verdict"] == "no data":
        return f"{head}: no shared seeds."
    if r["verdict"] in ("better", "worse"):
        return f"{head}: **{m} is {r['verdict']}**, {diff}; {stats}. {ruled}"
    if not math.isfinite(r["mde"]):
        return (f"{head}: no detectable difference at this power (the MDE is infinite: with this many seeds the "
                f"test cannot reach its level), {diff}; {stats}. {ruled}")
    return f"{head}: no detectable difference, {diff}; {stats}. {ruled}"


def _per_seed(per_seed: dict[int, float], scale: float, fmt: str) -> str:
    """'s0 +1.2, s1 -0.4, ...': the paired differences a test was computed from, so a reader can redo it."""
    return ", ".join(f"s{s} {fmt.format(v * scale)}" for s, v in sorted(per_seed.items())) or "none"


def _comparison_table(res: GridResults, t: pd.DataFrame, lower_better: bool = False, ci: float = 0.95) -> list[str]:
    scale, fmt = (1.0, "{:+.4f}") if lower_better else (PCT, "{:+.1f}")
    out = [f"| method | base | lag | difference [{ci:.0%} sign-flip interval] | wins | sign-flip p | Holm p | MDE | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, r in t.iterrows():
        mde_txt = "inf" if not math.isfinite(r["mde"]) else fmt.format(r["mde"] * scale).lstrip("+")
        out.append(f"| {_md_cell(res.label(r['cell']))} | {_md_cell(res.label(r['base']))} | {r['lag']} | "
                   f"{fmt.format(r['mean'] * scale)} [{fmt.format(r['lo'] * scale)}, {fmt.format(r['hi'] * scale)}] | "
                   f"{r['wins']}/{r['n']} | {r['p']:.3g} | {r['p_holm']:.3g} | {mde_txt} | {r['verdict']} |")  # fmt: skip
    return out


def hypotheses_md(res: GridResults, n_resamples: int, ci: float, seed: int,
                  title: str = "Declared hypotheses", note: str = "") -> list[str]:  # fmt: skip
    """The grid's declared hypotheses, one section and one Holm correction per family."""
    families: dict[str, dict] = {}
    for name, h in (res.meta.get("hypotheses") or {}).items():
        families.setdefault(h.get("family") or "", {})[name] = h
    several = len(families) > 1 or bool(res.meta.get("repair"))
    out = []
    for i, (family, hyps) in enumerate(families.items()):
        how = "" if i == 0 else "Tested as in the first declared section; Holm within this family only."
        out += _family_md(res, hyps, n_resamples, ci, seed, f"{title}: {family}" if family else title, note,
                          how, several)  # fmt: skip
    return out


def _family_md(res: GridResults, hyps: dict, n_resamples: int, ci: float, seed: int, title: str, note: str,
               how: str = "", several: bool = False) -> list[str]:  # fmt: skip
    """One Holm family of declared hypotheses, each with its endpoint and direction. ``how``: a short line in
    place of the method paragraph (a later family); ``several``: the grid declares more than this section."""
    rows = []
    for name, h in hyps.items():
        bases = [h["base"]] if isinstance(h["base"], str) else list(h["base"])
        lower = h.get("direction", "greater") == "less"
        runs = res.runs if not h.get("seeds") else res.runs[res.runs["seed"].between(*map(int, h["seeds"]))]
        t = compare(runs, [(h["method"], b, int(h["lag"])) for b in bases], h.get("endpoint", "late_test_avg_at_k"),
                    n_resamples, ci, seed, higher_is_better=not lower)  # fmt: skip
        if len(t) < len(bases):
            rows.append((name, h, None))
            continue
        rows.append((name, h, iut_row(t, lower)))
    done = [r for _, _, r in rows if r is not None]
    adjusted = holm([r["p"] for r in done])
    rest = ("The sections headed 'Declared' are pre-registered; everything else is exploratory." if several
            else "Everything after this section is exploratory.")  # fmt: skip
    out = [f"## {title}", "", *([note, ""] if note else []), *([how, ""] if how else [
           "Each hypothesis is tested with the exact two-sided paired sign-flip test on its endpoint; the p-values "
           "are Holm-corrected over these hypotheses only (one family), and the verdict follows the Holm p at 0.05 "
           "in the declared direction. A hypothesis over several bases is an intersection-union test: its p is the "
           "largest of its comparisons' p-values, and it is not supported if any difference has the wrong sign. "
           f"Interval: the {ci:.0%} interval of the same two-sided test (the shifts it does not reject at "
           f"{1 - ci:.2g}, before Holm; for a test over several bases, the binding comparison's), so it agrees "
           "with the p-value; two-sided because the test is, its end on the declared side is the one-sided "
           f"{1 - (1 - ci) / 2:.1%} bound. MDE: the smallest true difference the sign-flip test detects with 80 % "
           "power at this seed count (normal differences with the observed paired SD, simulated), at Holm's "
           "strictest level, 0.05 / the number of hypotheses; for a test over several bases, with all of its "
           f"comparisons rejecting. {rest}", ""]),
           f"| hypothesis | comparison | endpoint | n | difference [{ci:.0%} sign-flip interval] | sign-flip p | Holm p | MDE | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    words = []
    it = iter(adjusted)
    for name, h, r in rows:
        lower = h.get("direction", "greater") == "less"
        endpoint = h.get("endpoint", "late_test_avg_at_k")
        bases = [h["base"]] if isinstance(h["base"], str) else list(h["base"])
        every = res.label(bases[0]) if len(bases) == 1 else "each of " + ", ".join(res.label(b) for b in bases)
        comp = f"{res.label(h['method'])} {'<' if lower else '>'} {every} at lag {h['lag']}"
        if h.get("seeds"):
            comp += f", seeds {h['seeds'][0]}-{h['seeds'][1]}"
        if r is None:
            out.append(f"| {name} | {_md_cell(comp)} | `{endpoint}` | 0 | — | — | — | — | no data yet |")
            words.append(f"- **{name}** ({comp}): no finished runs on both sides yet.")
            continue
        r["p_holm"] = next(it)
        r["verdict"] = verdict_words(r["n"], r["mean"], r["p_holm"], higher_is_better=not lower)
        # the hypotheses' family, not the one compare() saw; an IUT needs all of its comparisons to reject
        r["mde"] = family_mde(r["sd"], r["n"], len(done)) if r["k"] == 1 else iut_mde(r["sds"], r["n"], 0.05 / len(done))
        scale, fmt = (1.0, "{:+.4f}") if endpoint.startswith("d_pi") else (PCT, "{:+.1f}")
        mde_txt = "inf" if not math.isfinite(r["mde"]) else fmt.format(r["mde"] * scale).lstrip("+")
        supported = {"better": "supported" if not r["wrong_sign"] else "not supported",
                     "worse": "contradicted (significant in the other direction)",
                     NO_DIFFERENCE: "not supported" if math.isfinite(r["mde"]) else NO_DIFFERENCE}
        out.append(f"| {name} | {_md_cell(comp)} | `{endpoint}` | {r['n']} | {fmt.format(r['mean'] * scale)} "
                   f"[{fmt.format(r['lo'] * scale)}, {fmt.format(r['hi'] * scale)}] | {r['p']:.3g} | {r['p_holm']:.3g} "
                   f"| {mde_txt} | {supported.get(r['verdict'], r['verdict'])} |")  # fmt: skip
        iut = (f" (intersection-union test over {r['k']} comparisons: p is the largest of their p-values; binding: "
               f"vs {res.label(r['base'])}; {r['wrong_sign']} of {r['k']} differences in the wrong direction)") if r["k"] > 1 else ""
        words.append(f"- **{name}**{iut}: {_verdict_sentence(res, r, endpoint, endpoint.startswith('d_pi'), ci)}"
                     + (f" Claim tested: {h['description']}" if h.get("description") else ""))  # fmt: skip
        words.append(f"  Per seed ({res.label(r['cell'])} - {res.label(r['base'])}): "
                     + _per_seed(r["per_seed"], scale, fmt) + ".")
    return out + [""] + words + [""]


def repair_md(res: GridResults, n_resamples: int, ci: float, seed: int) -> list[str]:
    """The grid's declared repaired fraction, with its bootstrap interval and the per-seed parts."""
    r = res.meta.get("repair")
    if not r:
        return []
    f = repaired_fraction(res.runs, r["method"], r["base"], int(r["lag"]), int(r["reference_lag"]),
                          r.get("endpoint", "late_test_avg_at_k"), n_resamples, ci, seed)  # fmt: skip
    m, b = res.label(r["method"]), res.label(r["base"])
    head = [f"## Declared: the share of {b}'s staleness damage that {m} repairs", "",
            f"R = mean({m} − {b} at lag {r['lag']}) / mean({b} at lag {r['reference_lag']} − {b} at lag {r['lag']}), "
            f"on `{r.get('endpoint', 'late_test_avg_at_k')}`, over the seeds all three runs share (1: all of the damage "
            f"repaired, 0: none, below 0: worse). Interval: {ci:.0%} percentile bootstrap over seeds "
            f"({n_resamples} resamples, numerator and denominator together); a ratio has no exact sign-flip "
            "interval, and this one is unreliable when the damage's own interval reaches 0.", ""]  # fmt: skip
    if not f["n"]:
        return head + ["No seed has all three runs yet.", ""]
    parts = ", ".join(f"s{s} {x * PCT:+.1f}/{y * PCT:+.1f}" for s, (x, y) in f["per_seed"].items())
    interval = f"[{f['lo']:.2f}, {f['hi']:.2f}]" if f["n"] > 1 else "(no interval from one seed)"
    return head + [f"- **R = {f['fraction']:.2f} {interval}** (n = {f['n']}): repair "
                   f"{f['repair'] * PCT:+.1f} points of a damage of {f['damage'] * PCT:+.1f}.",
                   f"  Per seed (repair/damage, points): {parts}.", ""]  # fmt: skip


def _family_sentence(t: pd.DataFrame) -> str:
    """How many of a table's comparisons survive Holm, and whether the seed count could detect anything."""
    if t.empty:
        return "No comparison has finished runs on both sides yet."
    sig = int(t["verdict"].isin(["better", "worse"]).sum())
    n = int(t["n"].median())
    floor = 2.0 / 2**n if n else 1.0
    reach = (f" With {n} seeds the smallest possible sign-flip p is {floor:.3g}, so after Holm over {len(t)} "
             f"comparisons none can reach 0.05: a null here is a null at (near) zero power, not evidence of no "
             "effect." if floor * len(t) >= 0.05 else "")  # fmt: skip
    return f"{sig} of {len(t)} comparisons differ after Holm's correction.{reach}"


def exploratory_md(res: GridResults, n_resamples: int, ci: float, seed: int) -> tuple[list[str], dict]:
    """Every comparison the grid did not declare: each cell vs the baseline, and the named pairs, on the
    primary endpoint and d_pi. Holm within each table."""
    key, name = endpoints(res)["primary"]
    out: list[str] = []
    tables: dict[str, pd.DataFrame] = {}
    baseline = res.meta.get("baseline")
    intro = ("Exploratory (not declared before the runs): paired by seed, the exact two-sided sign-flip p, "
             f"Holm-corrected over the rows of each table, and the same test's {ci:.0%} interval (the shifts of the "
             "mean difference it does not reject, before Holm); verdicts follow the Holm p. MDE: the sign-flip "
             "test's, at 80 % power for normal differences with the observed paired SD (simulated), at 0.05 / the "
             "table's number of rows (Holm's strictest level).")  # fmt: skip
    if baseline and baseline in set(res.finished["cell"]):
        t = paired_table(res.runs, baseline, key, n_resamples, ci, seed)
        tables[key] = t
        out += [f"## Exploratory: each method vs {res.label(baseline)} ({name})", "", intro, ""]
        out += _comparison_table(res, t, ci=ci) + ["", _family_sentence(t), ""]
    elif baseline:
        out += [f"## Exploratory: each method vs {baseline}", "", "The baseline has no finished runs yet.", ""]
    pairs = res.meta.get("pairs") or {}
    if pairs and not res.finished.empty:
        t = pairs_table(res.runs, pairs, key, n_resamples, ci, seed)
        d = pairs_table(res.runs, pairs, "d_pi_last25", n_resamples, ci, seed, higher_is_better=False)
        out += [f"## Exploratory: named pairs (each method vs its base), {name}", "", intro, ""]
        out += _comparison_table(res, t, ci=ci) + ["", _family_sentence(t), ""]
        out += ["**d_pi (last 25 %), lower is better** (method - base):", ""] + _comparison_table(res, d, True, ci) + [""]
    t = lag_table(res.runs, key, n_resamples, ci, seed) if not res.finished.empty else pd.DataFrame()
    if not t.empty:
        out += [f"## Exploratory: staleness damage (each method at a larger lag vs its smallest lag), {name}", "",
                intro + " Negative: the method scores lower when its rollouts are staler.", "",
                f"| method | lag vs lag | difference [{ci:.0%} sign-flip interval] | wins | sign-flip p | Holm p | MDE | verdict |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in _comparison_table(res, t.assign(lag=[f"{a} vs {b}" for a, b in zip(t["lag"], t["base_lag"])]), ci=ci)[2:]:
            cells = row.split(" | ")
            out.append(" | ".join([cells[0]] + cells[2:]))  # drop the base column: it is the method itself
        out += ["", _family_sentence(t), ""]
    return out, tables


def _sat_activity_md(res: GridResults) -> list[str]:
    """How much SAT acted, per SAT cell and lag: SAT can change a gradient only when q < log(1 + eps_high),
    with each run's own eps_high (from its config.yaml)."""
    m = res.metrics
    if "obj/q" not in m or m["obj/q"].notna().sum() == 0:
        return []
    sat = m[m["obj/q"].notna()]
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
    per_cell = res.finished.groupby(["cell", "lag"]).size()
    complete = int(per_cell.min()) if len(per_cell) == len(plan) else 0
    return (f" **Incomplete: {done} of {planned} planned runs finished** ({complete} complete seed(s) in every "
            f"cell and lag; the grid plans {seeds}): tests below use the seeds present on both sides of each "
            "comparison, and a verdict is final only at the planned seed count.")


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
                 sensitivity_seeds: tuple[tuple[int, int], ...] = ()) -> Path:  # fmt: skip
    """Write dest/report.md and dest/figures/*.png for the grid in out_dir. Returns report.md's path.
    ``sensitivity_min_seed``: also test the declared hypotheses on the seeds from that one on;
    ``sensitivity_seeds``: also test them on each inclusive seed range ``(lo, hi)``, one section each."""
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
    md += _sensitivity_md(res, boot, sensitivity_min_seed, sensitivity_seeds)
    explore, tables = exploratory_md(res, n_resamples, ci, seed)
    md += explore
    md += regime_md(res)
    md += _sat_activity_md(res)
    md += _figures_md(res, tables, dest, figdir)
    bad = res.runs[res.runs["status"] != "finished"]
    if len(bad):
        md += (
            ["## Runs not finished", ""] + [f"- `{r}`: {s}" for r, s in zip(bad["run"], bad["status"])] + [""]
        )
    path = dest / "report.md"
    path.write_text("\n".join(md))
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


def add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="grid output folder, e.g. runs/paper_table (or packed results)")
    parser.add_argument("--out", default=None, help="where report.md and figures/ go (default: run_dir)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--ci", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument(
        "--pack", default=None, help="also copy summaries/configs/evals/metrics.gz to this folder"
    )
    parser.add_argument(
        "--sensitivity-min-seed", type=int, default=None, metavar="N",
        help="also test the declared hypotheses on seeds >= N only (a sensitivity analysis)",
    )
    parser.add_argument(
        "--sensitivity-seeds", type=seed_range, action="append", default=[], metavar="A-B",
        help="also test the declared hypotheses on seeds A to B (inclusive) only; repeat for several ranges",
    )


def seed_range(text: str) -> tuple[int, int]:
    """``"0-5"`` -> ``(0, 5)``: an inclusive seed range for ``--sensitivity-seeds``."""
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
        raise argparse.ArgumentTypeError(f"expected a seed range A-B with A <= B, e.g. 0-5, got {text!r}")
    return int(lo), int(hi)


def run_report(args: argparse.Namespace) -> int:
    if not Path(args.run_dir).is_dir():
        print(f"satrl report: no such folder {args.run_dir}; give a grid's --out folder", file=sys.stderr)
        return 2
    if args.pack:
        from satrl.experiments.store import pack_results

        pack_results(args.run_dir, args.pack)
    extra = ["--sensitivity-min-seed", str(args.sensitivity_min_seed)] if args.sensitivity_min_seed is not None else []
    extra += [a for lo, hi in args.sensitivity_seeds for a in ("--sensitivity-seeds", f"{lo}-{hi}")]
    cmd = " ".join(["satrl", "report", str(args.run_dir)] + (["--out", str(args.out)] if args.out else []) + extra)
    try:
        path = build_report(args.run_dir, args.out, n_resamples=args.resamples, ci=args.ci, command=cmd,
                            sensitivity_min_seed=args.sensitivity_min_seed,
                            sensitivity_seeds=tuple(args.sensitivity_seeds))  # fmt: skip
    except NoRunsError as err:
        print(f"satrl report: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
