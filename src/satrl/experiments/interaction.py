"""A method's gain with staleness minus its gain without: the interaction a factorial over lags estimates.

Is a method a staleness repair, or a general improvement that also helps without staleness? Per seed s,

    I_s = (method@lag − base@lag) − (method@reference_lag − base@reference_lag)

(points of the endpoint; four runs per seed, on the seeds all four share). Its mean with the interval that inverts
the exact two-sided sign-flip test on the I_s (``significance.sign_flip_interval``), read against a margin declared
in advance (the vcpo_factorial protocol's "The interaction"): the interval above 0 → the gain is larger with
staleness (a staleness repair, at least in part); inside [−margin, +margin] → no larger with staleness than without,
within the margin; anything else → inconclusive at this size. ``satrl report --interaction`` adds the section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from satrl.experiments import plots
from satrl.experiments.mdtext import PCT
from satrl.experiments.significance import sign_flip_interval, sign_flip_p
from satrl.experiments.stats import seed_values
from satrl.experiments.store import GridResults

__all__ = ["Interaction", "InteractionError", "declared", "interaction", "interaction_md", "parse_interaction"]


class InteractionError(ValueError):
    """An interaction names a cell or lag the grid did not run (one line, ``satrl report`` exits 2)."""


@dataclass(frozen=True)
class Interaction:
    """What to estimate: ``method`` against ``base`` at ``lag`` and at ``reference_lag``, on seeds ``seeds``
    (inclusive; None: every seed), read against ``margin`` (endpoint units: a fraction for avg@k; None: no reading)."""

    method: str
    base: str
    lag: int
    reference_lag: int
    seeds: tuple[int, int] | None = None
    margin: float | None = None

    def flag(self) -> str:
        """The ``--interaction`` value that gives this (so the report's provenance line reproduces it)."""
        parts = [self.method, self.base, str(self.lag), str(self.reference_lag)]
        parts += [f"{self.seeds[0]}-{self.seeds[1]}" if self.seeds else "all"]
        return ",".join(parts + ([f"{self.margin * PCT:g}"] if self.margin is not None else []))


def declared(meta: dict) -> tuple[Interaction, ...]:
    """The interactions a grid file declares (``interactions:``, :class:`satrl.experiments.spec.InteractionSpec`)."""
    return tuple(Interaction(d["method"], d["base"], int(d["lag"]), int(d["reference_lag"]),
                             tuple(int(x) for x in d["seeds"]) if d.get("seeds") else None,
                             float(d["margin"]) if d.get("margin") is not None else None)
                 for d in meta.get("interactions") or [])  # fmt: skip


def parse_interaction(text: str) -> Interaction:
    """``"opob,grpo,32,0,34-49,2"`` -> :class:`Interaction` (METHOD,BASE,LAG,REFERENCE_LAG[,SEEDS[,MARGIN]]; SEEDS
    an inclusive range A-B or ``all``, MARGIN in points). A ValueError names what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    usage = "expected METHOD,BASE,LAG,REFERENCE_LAG[,SEEDS A-B or all[,MARGIN in points]], e.g. opob,grpo,32,0,34-49,2"
    if not 4 <= len(parts) <= 6 or not all(parts[:4]) or not (parts[2].isdigit() and parts[3].isdigit()):
        raise ValueError(f"{text!r}: {usage}")
    if parts[2] == parts[3] or parts[0] == parts[1]:  # I_s = 0 by construction: no estimate, a 0 reported (issue 60)
        same = f"lag {parts[2]} on both sides" if parts[2] == parts[3] else f"cell {parts[0]} on both sides"
        raise ValueError(f"{text!r}: {same}, so the interaction is 0 by construction: give the method and its base, "
                         "and two different lags (LAG, the stale one, and REFERENCE_LAG)")  # fmt: skip
    seeds = None
    if len(parts) > 4 and parts[4] != "all":
        lo, sep, hi = parts[4].partition("-")
        if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
            raise ValueError(f"{text!r}: seeds {parts[4]!r} is not a range A-B with A <= B; {usage}")
        seeds = (int(lo), int(hi))
    margin = None
    if len(parts) > 5:
        try:
            margin = float(parts[5]) / PCT
        except ValueError:
            raise ValueError(f"{text!r}: margin {parts[5]!r} is not a number of points; {usage}") from None
        if not (math.isfinite(margin) and margin > 0):
            raise ValueError(f"{text!r}: the margin must be a positive number of points, got {parts[5]!r}")
    return Interaction(parts[0], parts[1], int(parts[2]), int(parts[3]), seeds, margin)


def interaction(runs: pd.DataFrame, spec: Interaction, metric: str, ci: float = 0.95) -> dict:
    """The per-seed interaction and its test. Returns n, seeds, per_seed (a DataFrame: the two gains and I per seed),
    mean, lo, hi (the sign-flip interval of I), p (its exact two-sided sign-flip p), positive (seeds with I > 0) and
    the gains at each lag (``gain_lag`` and ``gain_ref``: mean, lo, hi). NaN where fewer than two seeds share all
    four runs."""
    if spec.seeds:
        runs = runs[runs["seed"].between(*spec.seeds)]
    four = [seed_values(runs, c, lag, metric) for lag in (spec.lag, spec.reference_lag) for c in (spec.method, spec.base)]
    seeds = sorted(set.intersection(*(set(v) for v in four)))
    t = pd.DataFrame({"seed": seeds})
    t["gain_lag"] = [four[0][s] - four[1][s] for s in seeds]
    t["gain_ref"] = [four[2][s] - four[3][s] for s in seeds]
    t["I"] = t["gain_lag"] - t["gain_ref"]
    out = {"n": len(seeds), "seeds": seeds, "per_seed": t, "positive": int((t["I"] > 0).sum())}
    for key, col in (("", "I"), ("gain_lag_", "gain_lag"), ("gain_ref_", "gain_ref")):
        x = t[col].to_numpy(dtype=float)
        lo, hi = sign_flip_interval(x, ci) if len(x) > 1 else (math.nan, math.nan)
        out |= {f"{key}mean": float(np.mean(x)) if len(x) else math.nan, f"{key}lo": lo, f"{key}hi": hi}
    out["p"] = sign_flip_p(t["I"].to_numpy(dtype=float)) if len(seeds) > 1 else math.nan
    return out


def reading(r: dict, margin: float | None) -> str:
    """The declared reading of the interval against the margin, in words."""
    if margin is None or not (math.isfinite(r["lo"]) and math.isfinite(r["hi"])):
        return "no reading (no margin declared, or no interval at this seed count)"
    if r["lo"] > 0:
        return "the interval lies above 0: the gain is larger with staleness (a staleness repair, at least in part)"
    if -margin <= r["lo"] and r["hi"] <= margin:
        return (f"the interval lies inside [−{margin * PCT:g}, +{margin * PCT:g}] points: the gain is no larger with "
                "staleness than without, within the margin")  # fmt: skip
    return (f"inconclusive at this size: the interval neither lies above 0 nor inside the margin "
            f"[−{margin * PCT:g}, +{margin * PCT:g}] points")  # fmt: skip


def interaction_md(res: GridResults, spec: Interaction, metric: str, ci: float = 0.95,
                   figdir: Path | None = None, is_declared: bool = False) -> list[str]:  # fmt: skip
    """The report's section: the estimate, its interval and reading, the per-seed table and (``figdir``: the
    report's figures folder) a figure of the per-seed gains at both lags. ``is_declared``: the grid file declares it
    (its heading says so; one asked for with ``--interaction`` is headed plainly)."""
    ran = set(zip(res.runs["cell"], res.runs["lag"]))
    m, b = res.label(spec.method), res.label(spec.base)
    where = f"seeds {spec.seeds[0]}-{spec.seeds[1]}" if spec.seeds else "every seed"
    title = (f"## {'Declared interaction' if is_declared else 'Interaction'}: {m} vs {b}, lag {spec.lag} against lag "
             f"{spec.reference_lag} ({where})")  # fmt: skip
    for cell, lag in ((c, lag) for c in (spec.method, spec.base) for lag in (spec.lag, spec.reference_lag)):
        if (cell, lag) in ran:
            continue
        if is_declared:  # a grid still running: the section says what it waits for
            return [title, "", f"No runs of {res.label(cell)} at lag {lag} yet.", ""]
        raise InteractionError(f"--interaction {spec.flag()}: the grid has no runs of {cell!r} at lag {lag} "
                               f"(cells: {', '.join(sorted(set(res.runs['cell'])))})")  # fmt: skip
    r = interaction(res.runs, spec, metric, ci)
    pts = lambda x: "—" if not math.isfinite(x) else f"{x * PCT:+.2f}"  # noqa: E731
    iv = lambda key: f"{pts(r[key + 'mean'])} [{pts(r[key + 'lo'])}, {pts(r[key + 'hi'])}]"  # noqa: E731
    p = "—" if not math.isfinite(r["p"]) else f"{r['p']:.3g}"
    md = [title, "",
          f"Per seed, I = ({m} − {b} at lag {spec.lag}) − ({m} − {b} at lag {spec.reference_lag}), in points of "
          f"`{metric}`: the method's gain with staleness minus its gain without, on the {r['n']} seeds that have "
          f"all four runs. Mean with the {ci:.0%} interval that inverts the exact two-sided sign-flip test on the "
          "I values (`satrl.experiments.interaction`); the two gains beside it, each with its own sign-flip "
          "interval. An estimate, outside any Holm family.", "",
          "| quantity | mean [interval], points | seeds |", "|---|---|---|",
          f"| gain at lag {spec.lag} | {iv('gain_lag_')} | {r['n']} |",
          f"| gain at lag {spec.reference_lag} | {iv('gain_ref_')} | {r['n']} |",
          f"| interaction I | {iv('')} (sign-flip p {p}; I > 0 on {r['positive']}/{r['n']}) | {r['n']} |",
          "", f"Reading (margin {'none' if spec.margin is None else f'{spec.margin * PCT:g} points'}): "
          f"{reading(r, spec.margin)}.", "", "| seed | gain at lag " + f"{spec.lag} | gain at lag {spec.reference_lag} | I |",
          "|---|---|---|---|"]  # fmt: skip
    md += [f"| {int(s)} | {pts(g)} | {pts(h)} | {pts(i)} |" for s, g, h, i in r["per_seed"].itertuples(index=False)]
    if figdir is None:
        return md + [""]
    seeds = f"_s{spec.seeds[0]}-{spec.seeds[1]}" if spec.seeds else ""  # two seed sets of one pair: two figures
    name = f"interaction_{spec.method}_{spec.base}_{spec.lag}_{spec.reference_lag}{seeds}.png"
    fig = plots.interaction_plot(r["per_seed"], (spec.lag, spec.reference_lag), (m, b), r, figdir / name)
    if fig.path is None:
        return md + ["", f"Figure skipped: {fig.note}.", ""]
    return md + ["", f"![{fig.title}]({fig.path.parent.name}/{fig.path.name})", "", f"*{fig.caption}*", ""]
