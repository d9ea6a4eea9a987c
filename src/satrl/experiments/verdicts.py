"""The report's tests in words: a grid's declared hypotheses (one Holm family per section), the repair family, the
exploratory comparisons, each with its sign-flip interval, its per-seed differences and what the interval rules out.
Numbers come from :mod:`satrl.experiments.stats` (an equivalence test's from :mod:`satrl.experiments.equivalence`); nothing
here computes a statistic of its own."""

from __future__ import annotations

import math

import pandas as pd

from satrl.experiments.equivalence import (
    equivalence_cells,
    equivalence_row,
    equivalence_sentence,
    margin_of,
    margin_text,
)
from satrl.experiments.mdtext import PCT, _md_cell, endpoint_units, endpoints
from satrl.experiments.secondary import (
    at_lags,
    base_lag_of,
    bases_of,
    comparisons_of,
    hypothesis_runs,
    secondary_md,
    sides,
)
from satrl.experiments.stats import (
    NO_DIFFERENCE,
    compare,
    family_mde,
    holm,
    iut_mde,
    iut_row,
    lag_table,
    paired_table,
    pairs_table,
    repaired_fraction,
    sign_flip_interval,
    sign_flip_p,
    verdict_words,
)
from satrl.experiments.store import GridResults


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
    m = sides(res, r)[0]
    scale, fmt = (1.0, "{:+.4f}") if lower_better else (PCT, "{:+.1f}")
    unit = "" if lower_better else " points"
    diff = f"{fmt.format(r['mean'] * scale)}{unit} [{fmt.format(r['lo'] * scale)}, {fmt.format(r['hi'] * scale)}]"
    ruled = rules_out(r["lo"], r["hi"], ci, lower_better)
    stats = (f"sign-flip p = {r['p']:.3g}, Holm p = {r['p_holm']:.3g}, n = {r['n']} seeds, MDE "
             f"{'inf' if not math.isfinite(r['mde']) else fmt.format(r['mde'] * scale).lstrip('+')}{unit}")  # fmt: skip
    head = f"{at_lags(res.label(r['cell']), res.label(r['base']), r['lag'], r['base_lag'])} ({what})"
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
        bases = bases_of(h)
        lower = h.get("direction", "greater") == "less"
        t = compare(hypothesis_runs(res.runs, h), comparisons_of(h),
                    h.get("endpoint", "late_test_avg_at_k"), n_resamples, ci, seed, higher_is_better=not lower)  # fmt: skip
        if len(t) < len(bases):
            rows.append((name, h, None))
            continue
        margin = margin_of(h)
        rows.append((name, h, iut_row(t, lower) if margin is None else equivalence_row(t, margin)))
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
           *([_TOST_NOTE, ""] if any(margin_of(h) is not None for h in hyps.values()) else []),
           f"| hypothesis | comparison | endpoint | n | difference [{ci:.0%} sign-flip interval] | sign-flip p | Holm p | MDE | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    words, secondary = [], []
    it = iter(adjusted)
    for name, h, r in rows:
        lower = h.get("direction", "greater") == "less"
        endpoint = h.get("endpoint", "late_test_avg_at_k")
        comp = _comparison_text(res, h)
        secondary.append((name, comp, h, r))
        if r is None:
            out.append(f"| {name} | {_md_cell(comp)} | `{endpoint}` | 0 | — | — | — | — | no data yet |")
            words.append(f"- **{name}** ({comp}): no finished runs on both sides yet.")
            continue
        r["p_holm"] = next(it)
        if margin_of(h) is not None:
            _equivalence_lines(res, name, comp, h, r, ci, out, words)
            continue
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
        words.append(f"  Per seed ({' - '.join(sides(res, r))}): "
                     + _per_seed(r["per_seed"], scale, fmt) + ".")
    return out + [""] + secondary_md(res, secondary, ci, brief=bool(how or note)) + words + [""]


_TOST_NOTE = ("A hypothesis declared `equivalent` is tested with the two one-sided exact sign-flip tests (TOST, "
              "Schuirmann 1987): p₁ of H0 mean ≤ −margin on the per-seed differences + margin, p₂ of H0 mean ≥ +margin "
              "on the differences − margin, all 2^n sign patterns (a seeded Monte Carlo above 20 seeds); its p = "
              "max(p₁, p₂), in the sign-flip p column, enters the Holm family above. Supported, equivalent within "
              "±margin, when its Holm p is below 0.05, which needs the 90% sign-flip interval (the one the TOST at "
              "0.05 inverts) inside the margin; otherwise not shown equivalent, which is no evidence of no difference. "
              "Its row shows the 90% interval after the report's own and no MDE (—).")  # fmt: skip


def _equivalence_lines(res: GridResults, name: str, comp: str, h: dict, r: pd.Series, ci: float,
                       out: list[str], words: list[str]) -> None:  # fmt: skip
    """An equivalence hypothesis's table row (into ``out``) and sentences (into ``words``), read with its Holm p."""
    endpoint = h.get("endpoint", "late_test_avg_at_k")
    scale, fmt, unit = endpoint_units(endpoint)
    r["mde"] = float("nan")  # a TOST has no MDE of the two-sided test's kind
    diff, verdict = equivalence_cells(r, scale, fmt, unit)
    head = f"{at_lags(res.label(r['cell']), res.label(r['base']), r['lag'], r['base_lag'])} ({endpoint})"
    if r["n"] == 0:  # runs on both sides, none of one seed: as a directional hypothesis reads it
        out.append(f"| {name} | {_md_cell(comp)} | `{endpoint}` | 0 | — | — | — | — | no data |")
        words.append(f"- **{name}** (two one-sided tests): {head}: no shared seeds.")
        return
    r["verdict"] = verdict
    out.append(f"| {name} | {_md_cell(comp)} | `{endpoint}` | {r['n']} | {diff} | {r['p']:.3g} | {r['p_holm']:.3g} "
               f"| — | {verdict} |")  # fmt: skip
    words.append(f"- **{name}** (two one-sided tests): {equivalence_sentence(head, r, scale, fmt, unit, ci)}"
                 + (f" Claim tested: {h['description']}" if h.get("description") else ""))
    words.append(f"  Per seed ({' - '.join(sides(res, r))}): "
                 + _per_seed(r["per_seed"], scale, fmt) + ".")


def _declared_damage(res: GridResults) -> list[str]:
    """A sentence naming the declared hypotheses that test a cell against itself at another lag (``base_lag``): the
    table above holds the same comparisons, exploratory; the declared test is the one to read."""
    own = [f"{n} ({_comparison_text(res, h)})" for n, h in (res.meta.get("hypotheses") or {}).items()
           if h["method"] in bases_of(h) and base_lag_of(h) != int(h["lag"])]  # fmt: skip
    return ["", f"Declared before the runs, and tested above: {'; '.join(own)}."] if own else []


def _comparison_text(res: GridResults, h: dict) -> str:
    """'VCPO > GRPO at lag 32, seeds 24-33' ('A ≈ B (±1.0 points) at lag 32' for an equivalence): a declared
    hypothesis's comparison as its table row names it."""
    bases = bases_of(h)
    every = res.label(bases[0]) if len(bases) == 1 else "each of " + ", ".join(res.label(b) for b in bases)
    op = "<" if h.get("direction", "greater") == "less" else ">"
    if (margin := margin_of(h)) is not None:
        scale, _, unit = endpoint_units(h.get("endpoint", "late_test_avg_at_k"))
        op, every = "≈", f"{every} ({margin_text(margin, scale, unit)})"
    comp = at_lags(res.label(h["method"]), every, h["lag"], base_lag_of(h), op)
    return comp + (f", seeds {h['seeds'][0]}-{h['seeds'][1]}" if h.get("seeds") else "")


def repair_seeds(meta: dict) -> tuple[tuple[int, int] | None, str]:
    """The seed range the declared repaired fraction is computed on (None: every seed) and where it comes from:
    the repair's own ``seeds``, else those of the declared hypotheses that test its method against its base at
    its lag (a protocol defines the fraction on its confirmation's seeds), else every seed."""
    r = meta["repair"]
    if r.get("seeds"):
        return (int(r["seeds"][0]), int(r["seeds"][1])), "the repair's own `seeds`"
    same = [n for n, h in (meta.get("hypotheses") or {}).items()
            if h["method"] == r["method"] and r["base"] in bases_of(h) and int(h["lag"]) == base_lag_of(h) == int(r["lag"])]  # fmt: skip
    ranges = {tuple(int(x) for x in meta["hypotheses"][n]["seeds"]) if meta["hypotheses"][n].get("seeds") else None
              for n in same}  # fmt: skip
    if len(ranges) == 1 and None not in ranges:
        return ranges.pop(), f"those of declared hypothesis {', '.join(same)}, which tests the same comparison"
    return None, "every seed"


def _fraction(runs: pd.DataFrame, r: dict, n_resamples: int, ci: float, seed: int) -> dict:
    return repaired_fraction(runs, r["method"], r["base"], int(r["lag"]), int(r["reference_lag"]),
                             r.get("endpoint", "late_test_avg_at_k"), n_resamples, ci, seed)  # fmt: skip


def _fraction_lines(f: dict, ci: float, lead: str = "") -> list[str]:
    """'- **R = 0.22 [-0.35, 0.63]** (n = 10): ...' (plain after a ``lead``, bold without one), with the damage's
    own sign-flip interval and p, and the per-seed parts."""
    damage = [y for _, y in f["per_seed"].values()]
    lo, hi = sign_flip_interval(damage, ci)
    value = f"R = {f['fraction']:.2f} " + (f"[{f['lo']:.2f}, {f['hi']:.2f}]" if f["n"] > 1 else "(no interval from one seed)")
    parts = ", ".join(f"s{s} {x * PCT:+.1f}/{y * PCT:+.1f}" for s, (x, y) in f["per_seed"].items())
    return [f"- {lead + value if lead else f'**{value}**'} (n = {f['n']}): repair {f['repair'] * PCT:+.1f} points of a "
            f"damage of {f['damage'] * PCT:+.1f} (the damage's {ci:.0%} sign-flip interval [{lo * PCT:+.1f}, "
            f"{hi * PCT:+.1f}], p = {sign_flip_p(damage):.3g}).",
            f"  Per seed (repair/damage, points): {parts}."]  # fmt: skip


def repair_md(res: GridResults, n_resamples: int, ci: float, seed: int) -> list[str]:
    """The grid's declared repaired fraction on its declared seeds (:func:`repair_seeds`), with its bootstrap
    interval, the damage's sign-flip interval and the per-seed parts; the fraction pooled over every seed, if that
    adds seeds, is shown after it as exploratory."""
    r = res.meta.get("repair")
    if not r:
        return []
    seeds, source = repair_seeds(res.meta)
    f = _fraction(res.runs if seeds is None else res.runs[res.runs["seed"].between(*seeds)], r, n_resamples, ci, seed)
    m, b = res.label(r["method"]), res.label(r["base"])
    where = "every seed" if seeds is None else f"seeds {seeds[0]}-{seeds[1]}, {source}"  # the protocol's seeds
    head = [f"## Declared: the share of {b}'s staleness damage that {m} repairs", "",
            f"R = mean({m} − {b} at lag {r['lag']}) / mean({b} at lag {r['reference_lag']} − {b} at lag {r['lag']}), "
            f"on `{r.get('endpoint', 'late_test_avg_at_k')}`, over the declared seeds that all three runs share: "
            f"{where} (1: all of the damage repaired, 0: none, below 0: worse). Interval: {ci:.0%} percentile bootstrap "
            f"over seeds ({n_resamples} resamples, numerator and denominator together); a ratio has no exact "
            "sign-flip interval, and this one is unreliable when the damage's own interval reaches 0.", ""]  # fmt: skip
    if not f["n"]:
        return head + ["No seed has all three runs yet.", ""]
    out = head + _fraction_lines(f, ci)
    pooled = _fraction(res.runs, r, n_resamples, ci, seed) if seeds is not None else f
    extra = sorted(set(pooled["per_seed"]) - set(f["per_seed"]))
    if extra:
        out += _fraction_lines(pooled, ci, "Exploratory (not declared), pooled over every seed with all three runs, "
                                           f"seeds {', '.join(map(str, extra))} outside the declared range included: ")  # fmt: skip
    return out + [""]


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
        out += ["", _family_sentence(t), *_declared_damage(res), ""]
    return out, tables
