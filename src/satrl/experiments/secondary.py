"""What a declared claim rests on, beside it: each declared hypothesis's secondary endpoints, the late-window means of
test pass@k and test greedy accuracy (``store.LATE_EVAL_KEYS``, read from each run's eval.jsonl with the primary
endpoint's window), each tested with the hypothesis's own paired exact sign-flip test on its own seeds; and the
per-run table, every run's scores with the CPU kind it ran on. The secondary tests are not corrected: no Holm family,
no verdict, so a reader sees whether the primary's result carries over to the other scores."""

from __future__ import annotations

import math

import pandas as pd

from satrl.experiments.equivalence import equivalence_row, margin_of
from satrl.experiments.mdtext import PCT, _f, _md_cell, endpoints
from satrl.experiments.stats import compare, iut_row
from satrl.experiments.store import GridResults

# (runs-frame column, name in the report): store.LATE_EVAL_KEYS, in the order the report shows them
SECONDARY = (("late_test_pass_at_k", "late test pass@k"), ("late_test_greedy_acc", "late test greedy accuracy"))


def bases_of(h: dict) -> list[str]:
    return [h["base"]] if isinstance(h["base"], str) else list(h["base"])


def base_lag_of(h: dict) -> int:
    """The lag a declared hypothesis's base cells are read at: its ``base_lag``, else its ``lag``."""
    return int(h["lag"] if h.get("base_lag") is None else h["base_lag"])


def comparisons_of(h: dict) -> list[tuple[str, str, int, int]]:
    """A declared hypothesis as :func:`satrl.experiments.stats.compare`'s comparisons, one per base cell."""
    return [(h["method"], b, int(h["lag"]), base_lag_of(h)) for b in bases_of(h)]


def at_lags(method: str, base: str, lag: int, base_lag: int, op: str = "vs") -> str:
    """'A vs B at lag 32', or 'A at lag 0 vs B at lag 128' when the two sides are read at different lags."""
    if int(lag) == int(base_lag):
        return f"{method} {op} {base} at lag {lag}"
    return f"{method} at lag {lag} {op} {base} at lag {base_lag}"


def sides(res: GridResults, r: pd.Series) -> tuple[str, str]:
    """A comparison row's two sides as a sentence names them: 'A', 'B', or 'A at lag 0', 'A at lag 128' when they
    are read at different lags (a damage test)."""
    m, b = res.label(r["cell"]), res.label(r["base"])
    if int(r["lag"]) == int(r["base_lag"]):
        return m, b
    return f"{m} at lag {r['lag']}", f"{b} at lag {r['base_lag']}"


def hypothesis_runs(runs: pd.DataFrame, h: dict) -> pd.DataFrame:
    """The runs a declared hypothesis is tested on: those of its ``seeds`` range (every run when it names none)."""
    return runs if not h.get("seeds") else runs[runs["seed"].between(*map(int, h["seeds"]))]


def secondary_row(res: GridResults, h: dict, endpoint: str, ci: float = 0.95) -> pd.Series | None:
    """The hypothesis's test on ``endpoint``: with one base that comparison, with several the one an
    intersection-union test binds on (the largest p), as for the primary; for an equivalence hypothesis its two
    one-sided tests at the declared margin. None without shared seeds."""
    bases = bases_of(h)
    t = compare(hypothesis_runs(res.runs, h), comparisons_of(h), endpoint, ci=ci)
    if len(t) < len(bases) or (t["n"] == 0).any():
        return None
    if (margin := margin_of(h)) is not None:
        return equivalence_row(t, margin)
    return iut_row(t, lower=False)  # pass@k and greedy accuracy: higher is better whatever the primary's direction


def _diff_text(r: pd.Series | None, scale: float, fmt: str, binding=None, p_name: str = "p") -> str:
    """'+0.5 [-0.3, +1.2], 7/10 higher, p 0.17', with ' (vs <base>)' (``binding``: the cell's label) for a test
    over several bases; ``p_name`` 'TOST p' for an equivalence hypothesis."""
    if r is None or not math.isfinite(r["mean"]):
        return "—"
    text = (f"{fmt.format(r['mean'] * scale)} [{fmt.format(r['lo'] * scale)}, {fmt.format(r['hi'] * scale)}], "
            f"{r['wins']}/{r['n']} higher, {p_name} {r['p']:.3g}")  # fmt: skip
    return text + (f" (vs {binding(r['base'])})" if binding else "")


def present(res: GridResults) -> list[tuple[str, str]]:
    """The secondary endpoints some finished run has (none for runs made before the val/test split)."""
    fin = res.finished
    return [(k, name) for k, name in SECONDARY if k in fin and pd.to_numeric(fin[k], errors="coerce").notna().any()]


def _intro(names: str, ci: float, brief: bool) -> str:
    head = f"**Secondary endpoints (secondary, not corrected)**: {names}"
    if brief:
        return head + ", tested as in the first declared section, outside the Holm family."
    return (head + ", each the mean of its `eval.jsonl` score (`test_pass_at_k`, `test_greedy_acc`) over the "
            "evaluations in the last 25 % of steps, the primary's window. Each is tested as its hypothesis's primary "
            "is: paired by seed on the hypothesis's own seeds, the mean difference (method − base, points) with the "
            f"{ci:.0%} interval that inverts the exact two-sided sign-flip test, the seeds the method is higher on and "
            "the test's p. They are outside the Holm family and give no verdict; a hypothesis over several bases "
            "shows its binding comparison (the largest p).")  # fmt: skip


def secondary_md(res: GridResults, rows: list[tuple[str, str, dict, pd.Series | None]], ci: float = 0.95,
                 brief: bool = False) -> list[str]:  # fmt: skip
    """A table with one row per hypothesis (``rows``: name, comparison text, spec, its primary row or None): the
    primary's difference as in the Holm table, then each secondary endpoint's, from the same test. ``brief``: one
    line in place of the paragraph that says how (a section after the first)."""
    have = present(res)
    if not have or not rows:
        return []
    names = " and ".join(f"{name} (`{k}`)" for k, name in have)
    tost = any(margin_of(h) is not None for _, _, h, _ in rows)
    note = (" An equivalence hypothesis's endpoints are tested with its two one-sided tests at its declared margin "
            "(TOST p), read as its primary is." if tost else "")  # fmt: skip
    out = [_intro(names, ci, brief) + note, "", "| hypothesis | comparison | primary | " + " | ".join(n for _, n in have) + " |",
           "|---|---|---|" + "---|" * len(have)]  # fmt: skip
    for name, comp, h, primary in rows:
        endpoint = h.get("endpoint", "late_test_avg_at_k")
        binding = res.label if len(bases_of(h)) > 1 else None
        scale, fmt = (1.0, "{:+.4f}") if endpoint.startswith("d_pi") else (PCT, "{:+.1f}")
        p_name = "p" if margin_of(h) is None else "TOST p"
        cells = [f"`{endpoint}`: {_diff_text(primary, scale, fmt, binding, p_name)}"]
        cells += [_diff_text(secondary_row(res, h, k, ci), PCT, "{:+.1f}", binding, p_name) for k, _ in have]
        out.append(f"| {name} | {_md_cell(comp)} | " + " | ".join(_md_cell(c) for c in cells) + " |")
    return out + [""]


def runs_md(res: GridResults) -> list[str]:
    """One row per run: method, lag, seed, the CPU kind it ran on (`environment.json`), its status and the
    per-run numbers every comparison above is made of (the primary endpoint and the secondary ones)."""
    cols = [endpoints(res)["primary"]] + [c for c in SECONDARY if c[0] in res.runs and res.runs[c[0]].notna().any()]
    out = ["## Per-run results", "",
           "Every run, in points: the primary endpoint and, where the runs have them, the secondary ones, with the "
           "CPU kind each ran on (`environment.json`; a run's score can move with the CPU's vector unit, so a paired "
           "comparison is clean only where both runs of a pair ran on one kind).", "",
           "| method | lag | seed | CPU kind | status | " + " | ".join(name for _, name in cols) + " |",
           "|---|---|---|---|---|" + "---|" * len(cols)]  # fmt: skip
    for cell in res.cell_order():
        for _, r in res.runs[res.runs["cell"] == cell].sort_values(["lag", "seed"]).iterrows():
            kind = r["machine"] if isinstance(r.get("machine"), str) else "not recorded"
            vals = [_f(pd.to_numeric(r.get(k), errors="coerce"), "{:.2f}", PCT) for k, _ in cols]
            out.append(f"| {_md_cell(res.label(cell))} | {r['lag']} | {r['seed']} | {_md_cell(kind)} | {r['status']} | "
                       + " | ".join(vals) + " |")  # fmt: skip
    return out + [""]
