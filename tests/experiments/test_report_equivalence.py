"""A declared equivalence hypothesis (``direction: equivalent`` with a ``margin``, the baselines trial's Q1): the grid
spec's validation, and the report's TOST inside the Holm family, read as "equivalent within ±margin" or "not shown
equivalent" with the side that fails, never as "no difference"; its secondary endpoints tested the same way."""

import math
import textwrap

import pandas as pd
import pytest
from test_report_evidence import _evals

from satrl.experiments.equivalence import equivalence_row, equivalence_sentence, margin_text
from satrl.experiments.mdtext import endpoint_units
from satrl.experiments.report import build_report
from satrl.experiments.significance import sign_flip_interval
from satrl.experiments.spec import load_grid, spec_to_yaml
from satrl.experiments.stats import compare

GRID = """
    cells: {grpo: {}, opob: {}, offset: {}}
    hypotheses:
      Q1: {method: offset, base: opob, lag: 32, direction: equivalent, margin: 0.01, description: the offset is OPOB}
      Q2: {method: offset, base: grpo, lag: 32}
"""


def _grid(tmp_path, hypothesis: str) -> str:
    g = tmp_path / "g.yaml"
    g.write_text(f"base: x.yaml\nlags: [32]\ncells: {{a: {{}}, b: {{}}}}\nhypotheses:\n  Q1: {hypothesis}\n")
    try:
        load_grid(g, check_paths=False)
    except ValueError as e:
        return str(e).split(": ", 1)[1]
    return "valid"


def test_the_spec_takes_a_margin_only_with_equivalent(tmp_path):
    q = "{method: a, base: b, lag: 32"
    assert _grid(tmp_path, q + ", direction: equivalent, margin: 0.01}") == "valid"
    assert _grid(tmp_path, q + ", direction: equivalent}") == ("hypotheses.Q1.margin: Value error, direction: "
                                                                "equivalent needs a margin > 0 (in the endpoint's units: "
                                                                "0.01 is 1 point)")  # fmt: skip
    assert _grid(tmp_path, q + ", margin: 0.01}") == ("hypotheses.Q1.margin: Value error, only an equivalence "
                                                      "hypothesis (direction: equivalent) takes a margin")  # fmt: skip
    assert _grid(tmp_path, q + ", direction: less, margin: 0.01}").startswith("hypotheses.Q1.margin: Value error, only")
    assert _grid(tmp_path, q + ", direction: equivalent, margin: 0}") == "hypotheses.Q1.margin: Input should be greater than 0"
    assert _grid(tmp_path, q + ", direction: equivalent, margin: .inf}") == "hypotheses.Q1.margin: Input should be a finite number"
    assert _grid(tmp_path, "{method: a, base: [b], lag: 32, direction: equivalent, margin: 0.01}") == (
        "hypotheses.Q1: Value error, base: an equivalence hypothesis compares with one base cell, not a list")
    # a refused direction is the one error, not a margin error beside it
    assert _grid(tmp_path, q + ", direction: same, margin: 0.01}") == (
        "hypotheses.Q1.direction: Input should be 'greater', 'less' or 'equivalent'")


def test_the_margin_survives_the_grid_as_run(tmp_path):
    (tmp_path / "x.yaml").write_text("{}\n")
    (tmp_path / "g.yaml").write_text("base: x.yaml\nlags: [32]\ncells: {grpo: {}, opob: {}, offset: {}}\n"
                                     + textwrap.dedent(GRID).split("cells: {grpo: {}, opob: {}, offset: {}}\n")[1])  # fmt: skip
    (tmp_path / "run.yaml").write_text(spec_to_yaml(load_grid(tmp_path / "g.yaml"), 3))
    again = load_grid(tmp_path / "run.yaml", check_paths=False)
    assert again.hypotheses["Q1"].margin == 0.01 and again.hypotheses["Q2"].margin is None


def _report(tmp_path, make_run, offset_minus_opob, seeds: int = 10) -> str:
    """offset - OPOB at lag 32 is ``offset_minus_opob(seed)`` (a share) on seeds 0..``seeds`` - 1; offset - GRPO is
    that plus 1.5 points, positive on every seed, so Q2's p = 2/2^n. On the secondary endpoints offset - OPOB is +3
    points of pass@k and 0 of greedy accuracy on every seed."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(seeds):
        g = 0.70 + 0.005 * s
        d = offset_minus_opob(s)
        for cell, v, pass_k in (("opob", g, 0.90), ("offset", g + d, 0.93), ("grpo", g + d - 0.015, 0.90)):
            make_run(out, cell, 32, s, {"late_test_avg_at_k": v, "steps": 600}, evals=_evals(v, pass_k, 0.8))
    md = build_report(out, n_resamples=200).read_text()
    return md.split("## Declared hypotheses")[1].split("\n## ")[0]


def test_equivalence_shown_by_hand(tmp_path, make_run):
    """offset - OPOB = +0.5 points on all 10 seeds. p1: d + 1 point = +1.5 on every seed, only the observed pattern
    reaches its sum, 1/1024; p2: 1 point - d = +0.5 on every seed, 1/1024 too. TOST p = 1/1024 = 0.000977; Q2: ten
    positive differences, 2/1024. Holm over the two: 2 * 0.000977 = 0.00195, then max(0.00195, 0.00195)."""
    sec = _report(tmp_path, make_run, lambda s: 0.005)
    assert ("| Q1 | offset ≈ opob (±1.0 points) at lag 32 | `late_test_avg_at_k` | 10 | +0.5 [+0.5, +0.5]; 90%: "
            "[+0.5, +0.5] | 0.000977 | 0.00195 | — | supported: equivalent within ±1.0 points |") in sec
    assert "| Q2 | offset > grpo at lag 32 | `late_test_avg_at_k` | 10 | +1.5 [+1.5, +1.5] | 0.00195 | 0.00195 |" in sec
    assert ("- **Q1** (two one-sided tests): offset vs opob at lag 32 (late_test_avg_at_k): **equivalent within ±1.0 "
            "points**, +0.5 points, 90% sign-flip interval [+0.5, +0.5] (the one the TOST at 0.05 inverts), 95% [+0.5, "
            "+0.5]; TOST p = max(p₁ 0.000977, p₂ 0.000977) = 0.000977, Holm p = 0.00195, n = 10 seeds.") in sec
    assert "Claim tested: the offset is OPOB" in sec and "  Per seed (offset - opob): s0 +0.5, s1 +0.5," in sec
    assert "two one-sided exact sign-flip tests (TOST, Schuirmann 1987)" in sec
    # secondary endpoints, TOST at the same margin: pass@k +3 points on every seed (p1 = 1/1024, and 1 - 3 = -2 on
    # every seed gives p2 = 1: every sum is >= the observed, the smallest); greedy accuracy 0 on every seed, both sides
    # +1 point on every seed: 1/1024
    row = next(line for line in sec.splitlines() if line.startswith("| Q1 | offset ≈ opob (±1.0 points) at lag 32 | `late_test_avg_at_k`:"))
    assert row.endswith("| `late_test_avg_at_k`: +0.5 [+0.5, +0.5], 10/10 higher, TOST p 0.000977 | +3.0 [+3.0, +3.0], "
                        "10/10 higher, TOST p 1 | +0.0 [+0.0, +0.0], 0/10 higher, TOST p 0.000977 |")
    assert "with its two one-sided tests at its declared margin (TOST p)" in sec


def test_not_shown_equivalent_names_the_failing_side(tmp_path, make_run):
    """offset - OPOB = +2 points on seeds 0-4, 0 on seeds 5-9 (mean +1.0). p1: d + 1 = 3 or 1, all positive, 1/1024.
    p2: 1 - d = -1 (five) or +1 (five), observed sum 0; the sign patterns with sum >= 0 are those with at least five
    +1s: (2^10 + C(10, 5)) / 2 = (1024 + 252) / 2 = 638 of 1024 = 0.623. Holm with Q2's 2/1024: max(2 * 0.00195, 0.623)."""
    sec = _report(tmp_path, make_run, lambda s: 0.02 if s < 5 else 0.0)
    lo, hi = sign_flip_interval([2.0] * 5 + [0.0] * 5, 0.90)
    assert lo > -1.0 and hi >= 1.0  # the upper side fails, the lower one holds
    assert "| 0.623 | 0.623 | — | not supported: not shown equivalent within ±1.0 points |" in sec
    assert f"; 90%: [{lo:+.1f}, {hi:+.1f}] |" in sec
    words = next(line for line in sec.splitlines() if line.startswith("- **Q1**"))
    assert ("**not shown equivalent within ±1.0 points** (which is not a finding of no difference), +1.0 points, "
            f"90% sign-flip interval [{lo:+.1f}, {hi:+.1f}]") in words
    assert "TOST p = max(p₁ 0.000977, p₂ 0.623) = 0.623, Holm p = 0.623" in words
    assert ("its upper end reaches +1.0 points or above (p₂ = 0.623: a difference above +1.0 points is not ruled out)."
            in words and "lower end" not in words)  # fmt: skip
    assert "no detectable difference" not in words and "no difference," not in words


def test_shown_before_holm_but_not_after(tmp_path, make_run):
    """Five seeds, +0.5 points each: TOST p = 1/32 = 0.0312 (each side's only extreme pattern is the observed one),
    Q2's 2/32; Holm: 2 * 0.0312 = 0.0625 for both. The 90% interval [+0.5, +0.5] is inside the margin (2/32 < 0.10
    rejects every other shift), so the failure is Holm's."""
    sec = _report(tmp_path, make_run, lambda s: 0.005, seeds=5)
    assert "| 0.0312 | 0.0625 | — | not supported: not shown equivalent within ±1.0 points |" in sec
    assert ("The 90% interval lies inside the margin, but the TOST p does not survive Holm's correction over the "
            "family.") in sec


@pytest.mark.parametrize(("margin", "endpoint", "text"), [(0.01, "late_test_avg_at_k", "±1.0 points"),
                                                           (0.0125, "late_test_avg_at_k", "±1.25 points"),
                                                           (0.005, "d_pi_last25", "±0.0050")])  # fmt: skip
def test_margin_printed_in_the_endpoints_units(margin, endpoint, text):
    scale, _, unit = endpoint_units(endpoint)
    assert margin_text(margin, scale, unit) == text


def test_too_few_seeds_to_show_equivalence_say_so():
    """Three seeds of +0.5 points: each side's only pattern as extreme as the observed is itself, p1 = p2 = 1/8; the
    two-sided test's smallest p, 2/8, is above 0.10, so the 90% interval is unbounded and the sentence says why."""
    runs = pd.DataFrame([dict(cell=c, lag=32, seed=s, status="finished", late_test_avg_at_k=0.7 + 0.01 * s + d)
                         for s in range(3) for c, d in (("offset", 0.005), ("opob", 0.0))])  # fmt: skip
    r = equivalence_row(compare(runs, [("offset", "opob", 32)], "late_test_avg_at_k"), 0.01)
    assert (r["p1"], r["p2"], r["p"], r["lo90"], r["hi90"]) == pytest.approx((1 / 8, 1 / 8, 1 / 8, -math.inf, math.inf))
    r["p_holm"] = r["p"]
    sentence = equivalence_sentence("offset vs opob", r, *endpoint_units("late_test_avg_at_k"))
    assert sentence.startswith("offset vs opob: **not shown equivalent within ±1.0 points** (which is not a finding")
    assert sentence.endswith("The 90% interval is unbounded: with this few seeds the two one-sided tests cannot show "
                             "equivalence within any margin.")  # fmt: skip


def test_no_shared_seeds_is_no_data(tmp_path, make_run):
    """offset ran seeds 0-2 and OPOB seeds 3-5: no pair, so no test and no reading (not "not shown equivalent")."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(3):
        make_run(out, "offset", 32, s, {"late_test_avg_at_k": 0.7})
        make_run(out, "opob", 32, s + 3, {"late_test_avg_at_k": 0.7})
    sec = build_report(out, n_resamples=100).read_text().split("## Declared hypotheses")[1].split("\n## ")[0]
    assert "| Q1 | offset ≈ opob (±1.0 points) at lag 32 | `late_test_avg_at_k` | 0 | — | — | — | — | no data |" in sec
    assert "- **Q1** (two one-sided tests): offset vs opob at lag 32 (late_test_avg_at_k): no shared seeds." in sec
    assert "not shown equivalent within" not in sec and "TOST p =" not in sec
