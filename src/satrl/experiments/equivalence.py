"""A declared equivalence hypothesis in the report (``direction: equivalent`` with a ``margin``): its test row, from
the two one-sided sign-flip tests (TOST, ``significance.tost_parts``) on the hypothesis's paired differences, and its
reading in words. Supported ("equivalent within ±margin") when its Holm-corrected p is below 0.05; otherwise "not
shown equivalent", with the difference, its 90% interval (the one TOST at 0.05 inverts: equivalence needs it inside
the margin), the report's own interval and the side that fails. Never read as "no difference": a test that does
not show equivalence shows nothing about its absence. The markdown around it is :mod:`satrl.experiments.verdicts`'."""

from __future__ import annotations

import math

import pandas as pd

from satrl.experiments.significance import sign_flip_interval, tost_parts

ALPHA = 0.05  # the report's verdict level (its Holm p is read at 0.05)
# TOST at level alpha rejects exactly when the two-sided (1 - 2 alpha) interval lies inside the margin
EQUIVALENCE_CI = 1.0 - 2 * ALPHA


def margin_of(h: dict) -> float | None:
    """A declared hypothesis's equivalence margin (endpoint units), None for a directional one. The grid spec allows a
    margin only with ``direction: equivalent`` and requires it there, so its presence selects the test."""
    m = h.get("margin")
    return None if m is None else float(m)


def equivalence_row(t: pd.DataFrame, margin: float) -> pd.Series:
    """The row an equivalence hypothesis is judged by, from ``compare``'s one comparison ``t``: its two-sided p
    replaced by the TOST p = max(p1, p2) (``p1``, ``p2`` kept), the 90% sign-flip interval (``lo90``, ``hi90``) beside
    the report's, the ``margin``, and the fields a declared row carries (``k`` = 1 comparison, no ``wrong_sign``)."""
    row = t.iloc[0].copy()
    d = list(row["per_seed"].values())
    row["p1"], row["p2"] = tost_parts(d, margin)
    row["p"] = max(row["p1"], row["p2"])
    row["lo90"], row["hi90"] = sign_flip_interval(d, EQUIVALENCE_CI)
    row["margin"], row["k"], row["wrong_sign"], row["sds"] = margin, 1, 0, [row["sd"]]
    return row


def margin_text(margin: float, scale: float, unit: str) -> str:
    """'±1.0 points' (a share endpoint, ``scale`` 100), '±0.0050' (d_pi): the margin as the report prints numbers."""
    v = margin * scale
    if not unit:
        return f"±{v:.4f}"
    return f"±{v:.1f}{unit}" if abs(v - round(v, 1)) < 1e-9 else f"±{v:g}{unit}"  # 1.25 points is not cut to 1.2


def equivalence_cells(r: pd.Series, scale: float, fmt: str, unit: str) -> tuple[str, str]:
    """The hypothesis table's difference cell (the report's interval, then the 90% one) and verdict cell."""
    f = lambda x: fmt.format(x * scale)  # noqa: E731
    diff = f"{f(r['mean'])} [{f(r['lo'])}, {f(r['hi'])}]; 90%: [{f(r['lo90'])}, {f(r['hi90'])}]"
    within = margin_text(r["margin"], scale, unit)
    verdict = f"supported: equivalent within {within}" if r["p_holm"] < ALPHA else f"not supported: not shown equivalent within {within}"
    return diff, verdict


def _failing_side(r: pd.Series, scale: float, fmt: str, unit: str) -> str:
    """Why equivalence was not shown, from the 90% interval's ends against the margin."""
    m = r["margin"]
    if not (math.isfinite(r["lo90"]) and math.isfinite(r["hi90"])):
        return ("The 90% interval is unbounded: with this few seeds the two one-sided tests cannot show equivalence "
                "within any margin.")  # fmt: skip
    sides = []
    if r["lo90"] <= -m:
        sides.append(f"its lower end reaches {fmt.format(-m * scale)}{unit} or below (p₁ = {r['p1']:.3g}: a "
                     f"difference below {fmt.format(-m * scale)}{unit} is not ruled out)")  # fmt: skip
    if r["hi90"] >= m:
        sides.append(f"its upper end reaches {fmt.format(m * scale)}{unit} or above (p₂ = {r['p2']:.3g}: a "
                     f"difference above {fmt.format(m * scale)}{unit} is not ruled out)")  # fmt: skip
    if sides:
        return "The 90% interval does not lie inside the margin: " + " and ".join(sides) + "."
    return ("The 90% interval lies inside the margin, but the TOST p does not survive Holm's correction over the "
            "family.")  # fmt: skip


def equivalence_sentence(head: str, r: pd.Series, scale: float, fmt: str, unit: str, ci: float = 0.95) -> str:
    """'<head>: **equivalent within ±1.0 points**, ...' or '**not shown equivalent** ...', with the difference, both
    intervals, p1, p2, the TOST p and its Holm p, and for a failure the side that fails."""
    f = lambda x: fmt.format(x * scale)  # noqa: E731
    within = margin_text(r["margin"], scale, unit)
    numbers = (f"{f(r['mean'])}{unit}, 90% sign-flip interval [{f(r['lo90'])}, {f(r['hi90'])}] (the one the TOST at "
               f"0.05 inverts), {ci:.0%} [{f(r['lo'])}, {f(r['hi'])}]; TOST p = max(p₁ {r['p1']:.3g}, p₂ "
               f"{r['p2']:.3g}) = {r['p']:.3g}, Holm p = {r['p_holm']:.3g}, n = {r['n']} seeds")  # fmt: skip
    if r["p_holm"] < ALPHA:
        return (f"{head}: **equivalent within {within}**, {numbers}. Both one-sided nulls, a mean difference at or "
                f"beyond {within}, are rejected.")  # fmt: skip
    return (f"{head}: **not shown equivalent within {within}** (which is not a finding of no difference), {numbers}. "
            + _failing_side(r, scale, fmt, unit))
