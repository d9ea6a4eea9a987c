"""What a declared claim rests on (issue 48, item 4): the secondary endpoints beside each declared hypothesis, each
run's CPU kind in the per-run table, and a declared repaired fraction computed on exactly the protocol's seeds."""

import json
import textwrap

import pytest

from satrl.diagnostics.collapse import CollapseConfig
from satrl.diagnostics.summary import summarize_run
from satrl.experiments.report import build_report
from satrl.experiments.spec import load_grid
from satrl.experiments.store import load_results


def _evals(test: float, pass_k: float, greedy: float, early: float = 0.0) -> list[dict]:
    """Evals at steps 0, 300, 500 and 600 of a 600-step run: the late window (steps 451-600) holds 500 and 600.
    Step 0 and 300 score ``early`` on every key, far from the late values, so a wrong window shows."""
    rows = [{"step": s, "k": 8, "val_avg_at_k": early, "test_avg_at_k": early, "test_pass_at_k": early,
             "test_greedy_acc": early} for s in (0, 300)]  # fmt: skip
    rows += [{"step": s, "k": 8, "val_avg_at_k": test, "test_avg_at_k": test, "test_pass_at_k": pass_k + d,
              "test_greedy_acc": greedy - d} for s, d in ((500, -0.01), (600, 0.01))]  # fmt: skip
    return rows


def test_late_eval_means_read_from_eval_jsonl_with_the_primarys_window(tmp_path, make_run):
    """The summary has no secondary keys; the store computes them from eval.jsonl: the mean of steps 500 and 600
    (by hand: (0.89 + 0.91) / 2 = 0.90 and (0.71 + 0.69) / 2 = 0.70), not step 0 or 300's 0.1; a step logged twice
    (a resumed run) counts once, its last row."""
    out = tmp_path / "out"
    evals = _evals(0.8, 0.9, 0.7, early=0.1)
    evals.append({**evals[-1], "test_pass_at_k": 0.95})  # step 600 again: the last row wins -> (0.89 + 0.95) / 2
    make_run(out, "grpo", 8, 0, {"late_test_avg_at_k": 0.8, "steps": 600, "summary_version": 2}, evals=evals)
    run = load_results(out).runs.iloc[0]
    assert run["late_test_pass_at_k"] == pytest.approx(0.92) and run["late_test_greedy_acc"] == pytest.approx(0.70)
    # the primary is the same function on test_avg_at_k: summarize_run's late_test_avg_at_k on these evals
    summary = summarize_run([{"step": 600}], _evals(0.8, 0.9, 0.7, early=0.1), CollapseConfig())
    assert summary["late_test_avg_at_k"] == pytest.approx(0.8)


GRID = """
    cells: {grpo: {label: GRPO}, vcpo: {label: VCPO}}
    hypotheses:
      P1: {method: vcpo, base: grpo, lag: 32, seeds: [4, 13], family: confirm}
"""


@pytest.fixture
def secondary_out(tmp_path, make_run):
    """VCPO vs GRPO at lag 32 on seeds 0-13. On the declared seeds 4-13: avg@k +4 points on every seed; pass@k +1
    on every seed; greedy accuracy +2 on seeds 4-8 and -2 on seeds 9-13. Seeds 0-3 (not declared) have pass@k -9
    points, which would flip its sign if they entered the test."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(14):
        g = 0.70 + 0.005 * s
        dp = -0.09 if s < 4 else 0.01
        dg = 0.02 if s < 9 else -0.02
        make_run(out, "grpo", 32, s, {"late_test_avg_at_k": g, "steps": 600}, evals=_evals(g, 0.9, 0.8))
        make_run(out, "vcpo", 32, s, {"late_test_avg_at_k": g + 0.04, "steps": 600},
                 evals=_evals(g + 0.04, 0.9 + dp, 0.8 + dg, early=0.5))  # fmt: skip
    return out


def test_secondary_endpoints_beside_the_primary_by_hand(secondary_out):
    md = build_report(secondary_out, n_resamples=200).read_text()
    sec = md.split("## Declared hypotheses")[1].split("\n## ")[0]
    # the Holm table is as before: one hypothesis, 10 positive differences, p = Holm p = 2/1024
    assert "| P1 | VCPO > GRPO at lag 32, seeds 4-13 | `late_test_avg_at_k` | 10 | +4.0 [+4.0, +4.0] | 0.00195 | 0.00195 |" in sec
    assert "**Secondary endpoints (secondary, not corrected)**" in sec
    row = next(line for line in sec.splitlines() if line.startswith("| P1 | VCPO > GRPO at lag 32, seeds 4-13 | `late_test_avg_at_k`:"))
    # pass@k: +1 point on all 10 declared seeds -> [+1.0, +1.0], p = 2/1024; greedy: five +2 and five -2 -> mean 0,
    # every shift in [-2, +2] leaves a balanced or tied sample (p >= 0.0625), p = 1 at 0
    assert row == ("| P1 | VCPO > GRPO at lag 32, seeds 4-13 | `late_test_avg_at_k`: +4.0 [+4.0, +4.0], 10/10 higher, "
                   "p 0.00195 | +1.0 [+1.0, +1.0], 10/10 higher, p 0.00195 | +0.0 [-2.0, +2.0], 5/10 higher, p 1 |")
    assert sec.index("**Secondary endpoints") > sec.index("| P1 | VCPO > GRPO at lag 32, seeds 4-13 | `late_test_avg_at_k` | 10")


def test_secondary_endpoints_are_left_out_of_the_holm_family(secondary_out):
    """A second declared hypothesis doubles P1's Holm p (a family of two); the secondary tests add none."""
    grid = secondary_out / "grid.yaml"
    grid.write_text(grid.read_text() + "  P2: {method: vcpo, base: grpo, lag: 32, seeds: [4, 13], family: confirm}\n")
    sec = build_report(secondary_out, n_resamples=200).read_text().split("## Declared hypotheses")[1]
    assert "| 10 | +4.0 [+4.0, +4.0] | 0.00195 | 0.00391 |" in sec


def test_no_secondary_table_for_runs_without_the_scores(tmp_path, make_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(4, 8):
        make_run(out, "grpo", 32, s, {"late_test_avg_at_k": 0.7}, evals=[{"step": 1, "avg_at_k": 0.7, "k": 8}])
        make_run(out, "vcpo", 32, s, {"late_test_avg_at_k": 0.72}, evals=[{"step": 1, "avg_at_k": 0.72, "k": 8}])
    md = build_report(out, n_resamples=200).read_text()
    assert "| P1 |" in md and "Secondary endpoints" not in md and "late test pass@k" not in md


def test_per_run_table_shows_each_runs_cpu_kind(tmp_path, make_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("cells: {grpo: {label: GRPO}}\n")
    for s, kind in enumerate(("AVX2", "AVX512", None)):
        d = make_run(out, "grpo", 32, s, {"late_test_avg_at_k": 0.7456 - 0.05 * s, "steps": 600},
                     evals=_evals(0.7456 - 0.05 * s, 0.9, 0.8))  # fmt: skip
        if kind:
            cpu = {"vendor": "AuthenticAMD", "model": "AMD EPYC", "capability": kind}
            (d / "environment.json").write_text(json.dumps({"sessions": [{"cpu": cpu}]}))
    sec = build_report(out, n_resamples=200).read_text().split("## Per-run results")[1].split("\n## ")[0]
    assert "| method | lag | seed | CPU kind | status | late test avg@k | late test pass@k | late test greedy accuracy |" in sec
    assert "| GRPO | 32 | 0 | AuthenticAMD AMD EPYC (AVX2) | finished | 74.56 | 90.00 | 80.00 |" in sec
    assert "| GRPO | 32 | 1 | AuthenticAMD AMD EPYC (AVX512) | finished | 69.56 | 90.00 | 80.00 |" in sec
    assert "| GRPO | 32 | 2 | not recorded | finished | 64.56 | 90.00 | 80.00 |" in sec


REPAIR_GRID = """
    cells: {grpo: {lags: [0, 32]}, sat: {lags: [32], label: SAT}}
    hypotheses:
      P3: {method: sat, base: grpo, lag: 32, seeds: [4, 9]}
    repair: {method: sat, base: grpo, lag: 32, reference_lag: 0}
"""


def _repair_runs(out, make_run):
    """GRPO loses 4 points from lag 0 to lag 32 on every seed. SAT repairs all of it on seeds 0-3 (a screen's,
    outside the declared range) and half of it on the declared seeds 4-9. By hand: declared R = 2 / 4 = 0.50; pooled
    over seeds 0-9 the repair is (4 * 4 + 6 * 2) / 10 = 2.8 points, R = 0.70."""
    for s in range(10):
        g0, g32 = 0.80 + 0.002 * s, 0.76 + 0.002 * s
        make_run(out, "grpo", 0, s, {"late_test_avg_at_k": g0})
        make_run(out, "grpo", 32, s, {"late_test_avg_at_k": g32})
        make_run(out, "sat", 32, s, {"late_test_avg_at_k": g32 + (0.04 if s < 4 else 0.02)})


def test_declared_repaired_fraction_uses_the_declared_seeds(tmp_path, make_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(REPAIR_GRID))
    _repair_runs(out, make_run)
    md = build_report(out, n_resamples=300).read_text()
    sec = md.split("## Declared: the share of grpo's staleness damage that SAT repairs")[1].split("\n## ")[0]
    assert "seeds 4-9, those of declared hypothesis P3, which tests the same comparison" in sec
    # damage +4 on all 6 seeds: sign-flip interval [+4.0, +4.0], p = 2/64
    assert ("- **R = 0.50 [0.50, 0.50]** (n = 6): repair +2.0 points of a damage of +4.0 (the damage's 95% sign-flip "
            "interval [+4.0, +4.0], p = 0.0312).") in sec
    assert "  Per seed (repair/damage, points): s4 +2.0/+4.0, s5 +2.0/+4.0," in sec
    pooled = next(line for line in sec.splitlines() if line.startswith("- Exploratory (not declared)"))
    assert "seeds 0, 1, 2, 3 outside the declared range included: R = 0.70 [" in pooled and "(n = 10)" in pooled


def test_repairs_own_seeds_and_no_pooled_line_without_extra_seeds(tmp_path, make_run):
    """`repair.seeds` (validated as a seed range) wins over a hypothesis's; a repair on every seed has no pooled
    line, since it adds nothing."""
    out = tmp_path / "out"
    out.mkdir()
    grid = textwrap.dedent(REPAIR_GRID).replace("reference_lag: 0}", "reference_lag: 0, seeds: [0, 3]}")
    (out / "grid.yaml").write_text(grid)
    _repair_runs(out, make_run)
    sec = build_report(out, n_resamples=300).read_text().split("## Declared: the share")[1].split("\n## ")[0]
    assert "seeds 0-3, the repair's own `seeds`" in sec and "- **R = 1.00 [1.00, 1.00]** (n = 4)" in sec
    assert "R = 0.70" in sec  # pooled over 0-9: seeds 4-9 are outside the repair's own range
    (out / "grid.yaml").write_text(textwrap.dedent(REPAIR_GRID).replace(", seeds: [4, 9]", ""))
    sec = build_report(out, n_resamples=300).read_text().split("## Declared: the share")[1].split("\n## ")[0]
    assert "share: every seed" in sec and "- **R = 0.70 [" in sec and "Exploratory" not in sec
    (tmp_path / "base.yaml").write_text("{}\n")
    bad = tmp_path / "g.yaml"
    bad.write_text(f"base: base.yaml\nlags: [32]\n{textwrap.dedent(REPAIR_GRID)}".replace("reference_lag: 0}", "reference_lag: 0, seeds: [9, 4]}"))
    with pytest.raises(ValueError, match="repair.seeds"):
        load_grid(bad)
