import argparse
import json
import math
import shutil
import textwrap

import pytest

from satrl.apps.report import add_report_args, run_report
from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.experiments.mdtext import fmt_ci
from satrl.experiments.plots import paired_eval_diffs
from satrl.experiments.report import build_report
from satrl.experiments.stats import compare, iut_row, mean_ci, sign_flip_mde
from satrl.experiments.store import pack_results
from satrl.experiments.verdicts import rules_out

FIGS = ["eval_curves.png", "d_pi.png", "sat_diagnostics.png", "gate_check.png", "bylag.png", "paired.png",
        "paired_curves.png"]


@pytest.fixture(scope="module")
def grid_out(tmp_path_factory, module_fake_trainer):
    """A finished grid produced by the runner with the fake trainer: a (baseline), b (SAT, +0.1), bad (fails).
    Run once for the module: its tests only read it (each report goes to a folder of its own, or a copy)."""
    command, _ = module_fake_trainer
    tmp_path = tmp_path_factory.mktemp("grid")
    (tmp_path / "base.yaml").write_text("{}\n")
    (tmp_path / "g.yaml").write_text(
        textwrap.dedent("""
        name: toy
        description: A toy grid.
        base: base.yaml
        lags: [2]
        seeds: 3
        steps: 8
        baseline: a
        cells:
          a: {offset: 0.3, label: Alpha}
          b: {offset: 0.4, sat: true, label: Beta, collapse: true}
          bad: {fail: true}
    """)
    )
    out = tmp_path / "runs" / "toy"
    res = run_grid_spec(load_grid(tmp_path / "g.yaml"), out, workers=2, command_fn=command, progress=False)
    assert res.exit_code == 1
    return out


def _row(md: str, label: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(f"| {label} |"))


def test_report_table_matches_summaries(grid_out, tmp_path):
    dest = tmp_path / "report"
    path = build_report(grid_out, dest, n_resamples=2000)
    md = path.read_text()
    for f in FIGS:
        assert (dest / "figures" / f).stat().st_size > 5000, f
        assert f"](figures/{f})" in md
    for label, cell in (("Alpha", "a"), ("Beta", "b")):
        summaries = [
            json.loads((grid_out / cell / "lag2" / f"seed{s}" / "summary.json").read_text()) for s in range(3)
        ]
        late = mean_ci([s["late_avg_at_k"] for s in summaries], n_resamples=2000)
        best = mean_ci([s["best_avg_at_k"] for s in summaries], n_resamples=2000)
        final = mean_ci([s["final_avg_at_k"] for s in summaries], n_resamples=2000)
        row = _row(md, label)
        assert row.startswith(f"| {label} | 2 | — | {fmt_ci(*late)} | {fmt_ci(*best)} | {fmt_ci(*final)} | 0/3 |"), row
    # by hand: late of b = 0.4 + 0.02 s - 0.02 -> mean 40.0 %; a is exactly 10 points lower on every seed,
    # but 3 seeds cannot give a sign-flip p below 2/8 = 0.25: no verdict
    assert "40.0 ±" in _row(md, "Beta")
    assert "| Beta | Alpha | 2 | +10.0 [-inf, +inf] | 3/3 | 0.25 | 0.25 | inf | no detectable difference at this power |" in md
    assert "0 of 1 comparisons differ after Holm's correction. With 3 seeds the smallest possible sign-flip p is 0.25" in md
    assert "`bad/lag2/seed0`: failed" in md
    assert "A toy grid." in md and "These runs predate the val/test split" in md


def test_report_without_sat_or_baseline_skips_figures(tmp_path, make_run):
    out = tmp_path / "out"
    for s, (x, y) in enumerate([(0.30, 0.31), (0.34, 0.33), (0.32, 0.36)]):
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": x, "final_test_avg_at_k": x, "d_pi_last25": 0.01},
                 metrics=[{"step": 1, "mismatch/d_pi": 0.01}], evals=[{"step": 1, "avg_at_k": x, "k": 8}])  # fmt: skip
        make_run(out, "gspo", 8, s, {"late_test_avg_at_k": y, "final_test_avg_at_k": y, "d_pi_last25": 0.02},
                 metrics=[{"step": 1, "mismatch/d_pi": 0.02}], evals=[{"step": 1, "avg_at_k": y, "k": 8}])  # fmt: skip
    md = build_report(out, n_resamples=2000).read_text()
    assert "Skipped: no SAT cells" in md and "Skipped: no `bylag/<k>/...` keys" in md
    assert "## Exploratory" not in md and "## Declared hypotheses" not in md
    assert (out / "figures" / "eval_curves.png").exists() and not (
        out / "figures" / "sat_diagnostics.png"
    ).exists()


def test_report_states_no_difference_at_this_power(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    (out).mkdir()
    (out / "grid.yaml").write_text("baseline: grpo\ncells: {grpo: {}, sat: {label: 'SAT |d|'}}\n")
    for s, d in enumerate([0.02, -0.03, 0.01, -0.01]):
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": 0.3, "final_test_avg_at_k": 0.3})
        make_run(out, "sat", 8, s, {"late_test_avg_at_k": 0.3 + d, "final_test_avg_at_k": 0.3})
    md = build_report(out, n_resamples=2000).read_text()
    # diffs +2, -3, +1, -1 points: |sum| = 1, and every sign pattern has an odd |sum| >= 1 -> p = 1 (by hand)
    assert "| SAT \\|d\\| | grpo | 8 | -0.2 [" in md and "| 2/4 | 1 | 1 | inf | no detectable difference at this power |" in md
    assert "| SAT \\|d\\| | 8 | — | 29.8 ± " in md  # the pipe in the label does not break the table


def test_report_cli_and_regeneration_from_packed_results(grid_out, tmp_path, capsys, no_pngs):
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    packed = tmp_path / "packed"
    args = parser.parse_args(
        [str(grid_out), "--out", str(tmp_path / "r1"), "--resamples", "500", "--pack", str(packed)]
    )
    assert run_report(args) == 0 and "wrote" in capsys.readouterr().out
    r1 = (tmp_path / "r1" / "report.md").read_text()
    assert run_report(parser.parse_args([str(packed), "--resamples", "500", "--out", str(packed)])) == 0
    r2 = (packed / "report.md").read_text()
    table = [line for line in r1.splitlines() if line.startswith("| Alpha") or line.startswith("| Beta")]
    assert table and table == [line for line in r2.splitlines() if line.startswith(("| Alpha", "| Beta"))]
    assert run_report(parser.parse_args([str(tmp_path / "nope")])) == 2
    assert pack_results(grid_out, tmp_path / "p2")  # non-empty


def test_report_named_pairs_section(tmp_path, make_run, no_pngs):
    """`pairs:` adds a method-vs-its-base table on the primary endpoint and on d_pi, with the known differences
    recovered, exact p-values and Holm within each table."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(
        "baseline: grpo\npairs: {sat: gspo}\ncells: {grpo: {}, gspo: {label: GSPO}, sat: {label: SAT-GSPO}}\n"
    )
    for s in range(6):
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": 0.5, "final_test_avg_at_k": 0.5, "d_pi_last25": 0.1})
        make_run(out, "gspo", 8, s, {"late_test_avg_at_k": 0.40 + s / 100, "final_test_avg_at_k": 0.4, "d_pi_last25": 0.2 + s / 100})
        make_run(out, "sat", 8, s, {"late_test_avg_at_k": 0.42 + s / 100, "final_test_avg_at_k": 0.4, "d_pi_last25": 0.19 + s / 100})
    md = build_report(out, n_resamples=2000).read_text()
    assert "## Exploratory: named pairs (each method vs its base)" in md
    section = md.split("## Exploratory: named pairs")[1]
    # +2 points on all 6 seeds: p = 2/64; one comparison in the family, so Holm p = p
    assert "| SAT-GSPO | GSPO | 8 | +2.0 [+2.0, +2.0] | 6/6 | 0.0312 | 0.0312 |" in section
    assert "| better |" in section.split("**d_pi")[0]
    d_pi = section.split("**d_pi")[1]
    assert "| SAT-GSPO | GSPO | 8 | -0.0100 [-0.0100, -0.0100] | 0/6 | 0.0312 | 0.0312 |" in d_pi and "| better |" in d_pi


def test_report_declared_hypotheses_are_one_holm_family(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent("""
        baseline: grpo
        cells: {grpo: {}, sat: {label: SAT}}
        hypotheses:
          H1: {method: sat, base: grpo, lag: 8, endpoint: late_test_avg_at_k, direction: greater}
          H2: {method: sat, base: grpo, lag: 8, endpoint: d_pi_last25, direction: less}
    """))
    for s in range(10):
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": 0.5, "d_pi_last25": 0.1, "summary_version": 2})
        make_run(out, "sat", 8, s, {"late_test_avg_at_k": 0.5 + 0.01 * (1 + s % 2), "d_pi_last25": 0.1 + (0.01 if s % 2 else -0.01),
                                    "summary_version": 2})  # fmt: skip
    md = build_report(out, n_resamples=1000).read_text()
    sec = md.split("## Declared hypotheses")[1].split("## ")[0]
    # H1: 10 positive diffs, p = 2/1024; H2: diffs +-0.01, five each: sum 0, p = 1. Holm: [2 * 0.00195, 1]
    assert "| H1 | SAT > grpo at lag 8 | `late_test_avg_at_k` | 10 | +1.5 [+1.0, +2.0] |" in sec and "| 0.00195 | 0.00391 |" in sec
    assert "| supported |" in sec
    assert "  Per seed (SAT - grpo): s0 +1.0, s1 +2.0, s2 +1.0, " in sec and "s9 +2.0." in sec  # the test's data
    assert "  Per seed (SAT - grpo): s0 -0.0100, s1 +0.0100, " in sec
    # Sign-flip intervals by hand. H1 (diffs 1 and 2 points, five each): a shift outside [1, 2] leaves ten diffs of
    # one sign, p = 2/1024, rejected; at 1 (or 2) five diffs are 0 with free signs, p = 2 * 32/1024 = 0.0625, kept.
    # H2 (diffs -0.01 and +0.01, five each): [-0.01, +0.01] the same way.
    assert "| H2 | SAT < grpo at lag 8 | `d_pi_last25` | 10 | +0.0000 [-0.0100, +0.0100] | 1 | 1 |" in sec
    # H2's MDE: the sign-flip test's own at Holm's strictest level 0.05 / 2, sd = 0.01054 (ddof 1); above the
    # paired-t formula's (t_0.9875,9 + t_0.8,9) * sd / sqrt(10) = (2.685 + 0.883) * 0.01054 / 3.162 = 0.0119
    h2_mde = sign_flip_mde(0.01 * math.sqrt(10 / 9), 10, 0.025)
    assert h2_mde > 0.0119 and f"| 1 | 1 | {h2_mde:.4f} | not supported |" in sec
    assert "**H2**: SAT vs grpo at lag 8 (d_pi_last25): no detectable difference, +0.0000 [-0.0100, +0.0100]" in sec
    assert (f"MDE {h2_mde:.4f}. The sign-flip test's 95% interval rules out a reduction larger than 0.0100, and an "
            "increase larger than 0.0100." in sec)
    assert "would have been detected with 80 % power" not in md  # no post-hoc power argument
    assert "Sensitivity" not in md
    md = build_report(out, n_resamples=1000, sensitivity_min_seed=3).read_text()
    sens = md.split("## Sensitivity: declared hypotheses on seeds >= 3")[1].split("## ")[0]
    # seeds 3-9: 7 positive diffs for H1, p = 2/128
    assert "| H1 | SAT > grpo at lag 8 | `late_test_avg_at_k` | 7 |" in sens and "| 0.0156 |" in sens
    assert md.split("## Declared hypotheses")[1].split("## ")[0] == sec  # the primary analysis is unchanged
    md = build_report(out, n_resamples=1000, sensitivity_seeds=((0, 5), (2, 2))).read_text()
    sens = md.split("## Sensitivity: declared hypotheses on seeds 0-5")[1].split("## ")[0]
    # seeds 0-5: 6 positive diffs for H1, p = 2/64; H2's diffs -,+,-,+,-,+ sum to 0, p = 1
    assert "| H1 | SAT > grpo at lag 8 | `late_test_avg_at_k` | 6 |" in sens and "| 0.0312 |" in sens
    assert "| H2 | SAT < grpo at lag 8 | `d_pi_last25` | 6 | +0.0000 [" in sens
    one = md.split("## Sensitivity: declared hypotheses on seeds 2-2")[1].split("## ")[0]
    assert "| H1 | SAT > grpo at lag 8 | `late_test_avg_at_k` | 1 |" in one
    assert md.split("## Declared hypotheses")[1].split("## ")[0] == sec


def test_each_hypothesis_family_gets_its_own_holm_correction(tmp_path, make_run, no_pngs):
    """The same two hypotheses as above, declared in two families: each is its own family of one, so Holm leaves
    H1's p as it is (0.00195) instead of doubling it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent("""
        cells: {grpo: {}, sat: {label: SAT}}
        hypotheses:
          H1: {method: sat, base: grpo, lag: 8, family: repair}
          H2: {method: sat, base: grpo, lag: 8, endpoint: d_pi_last25, direction: less, family: mismatch}
    """))
    for s in range(10):
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": 0.5, "d_pi_last25": 0.1, "summary_version": 2})
        make_run(out, "sat", 8, s, {"late_test_avg_at_k": 0.5 + 0.01 * (1 + s % 2), "d_pi_last25": 0.1,
                                    "summary_version": 2})  # fmt: skip
    md = build_report(out, n_resamples=200).read_text()
    repair = md.split("## Declared hypotheses: repair")[1].split("## ")[0]
    assert "| H1 |" in repair and "| H2 |" not in repair and "| 0.00195 | 0.00195 |" in repair
    assert "| H2 |" in md.split("## Declared hypotheses: mismatch")[1].split("## ")[0]


def test_declared_repaired_fraction_by_hand(tmp_path, make_run, no_pngs):
    """GRPO loses 4 or 5 points from lag 1 to lag 32; SAT at lag 32 gets back exactly half on every seed: R = 0.5
    (repair 2.25 points, printed +2.3 as the float is a hair above),
    and every bootstrap resample gives 0.5 too (the per-seed ratios are all 0.5 and the seed sets equal)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent("""
        cells: {grpo: {lags: [1, 32]}, sat: {lags: [32], label: SAT}}
        repair: {method: sat, base: grpo, lag: 32, reference_lag: 1}
    """))
    for s in range(4):
        g1, g32 = 0.80 + 0.01 * s, 0.76 + 0.01 * s - 0.01 * (s % 2)
        make_run(out, "grpo", 1, s, {"late_test_avg_at_k": g1, "summary_version": 2})
        make_run(out, "grpo", 32, s, {"late_test_avg_at_k": g32, "summary_version": 2})
        make_run(out, "sat", 32, s, {"late_test_avg_at_k": g32 + (g1 - g32) / 2, "summary_version": 2})
    md = build_report(out, n_resamples=300).read_text()
    sec = md.split("## Declared: the share of grpo's staleness damage that SAT repairs")[1].split("## ")[0]
    # 4 seeds: the damage's sign-flip p is at least 2/16, and its 95% interval is unbounded
    assert ("- **R = 0.50 [0.50, 0.50]** (n = 4): repair +2.3 points of a damage of +4.5 (the damage's 95% sign-flip "
            "interval [-inf, +inf], p = 0.125).") in sec
    assert "Per seed (repair/damage, points): s0 +2.0/+4.0, s1 +2.5/+5.0, s2 +2.0/+4.0, s3 +2.5/+5.0." in sec
    bad = out / "bad.yaml"
    bad.write_text("base: x.yaml\nlags: [1]\ncells: {a: {}}\nrepair: {method: a, base: a, lag: 1, reference_lag: 8}\n")
    with pytest.raises(ValueError, match="repair.base: cell 'a' does not run lag 8"):
        load_grid(bad, check_paths=False)


def test_report_cli_seed_ranges(capsys):
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    args = parser.parse_args(["runs/x", "--sensitivity-seeds", "0-5", "--sensitivity-seeds", "3-9"])
    assert args.sensitivity_seeds == [(0, 5), (3, 9)]
    for bad in ("5-0", "3", "a-b", "-2"):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["runs/x", "--sensitivity-seeds", bad])
        assert exc.value.code == 2 and "expected a seed range A-B" in capsys.readouterr().err


def test_report_hypothesis_over_several_bases_is_an_intersection_union_test(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent("""
        cells: {a: {}, b: {}, best: {}}
        hypotheses:
          H5: {method: best, base: [a, b], lag: 8}
          H6: {method: a, base: [b, best], lag: 8}
    """))
    for s in range(10):
        make_run(out, "a", 8, s, {"late_test_avg_at_k": 0.50, "summary_version": 2})
        make_run(out, "b", 8, s, {"late_test_avg_at_k": 0.40 + (0.01 if s < 7 else -0.01), "summary_version": 2})
        make_run(out, "best", 8, s, {"late_test_avg_at_k": 0.52 + 0.001 * s, "summary_version": 2})
    sec = build_report(out, n_resamples=500).read_text().split("## Declared hypotheses")[1].split("## ")[0]
    # best > a on all 10 seeds (p = 2/1024) and > b on all 10 (p = 2/1024): the IUT p is the larger, 0.00195
    assert "| H5 | best > each of a, b at lag 8 |" in sec and "| supported |" in sec
    assert "**H5** (intersection-union test over 2 comparisons" in sec
    # a beats b but loses to best on every seed: the binding comparison is the one in the wrong direction
    assert "| H6 | a > each of b, best at lag 8 |" in sec and "contradicted" in sec and "binding: vs best" in sec


def _iut_scores(wrong: bool) -> dict[tuple[str, int], float]:
    """best vs a: +3, +1, +2, +4, +5 points (all positive, p = 2/32); best vs b: +1, +1, +1, +1, -1 (p = 12/32:
    |sum| >= 3 for 0, 1, 4 or 5 minus signs, 2 * (1 + 5) patterns); with ``wrong``, best vs c: -1 on every seed
    (p = 2/32, the wrong sign), else +1 (p = 2/32)."""
    out = {}
    for s, (da, db) in enumerate(zip([3, 1, 2, 4, 5], [1, 1, 1, 1, -1])):
        out |= {("best", s): 0.5, ("a", s): 0.5 - da / 100, ("b", s): 0.5 - db / 100,
                ("c", s): 0.5 + (0.01 if wrong else -0.01)}  # fmt: skip
    return out


@pytest.mark.parametrize("wrong", [False, True])
def test_iut_p_is_the_largest_p_and_a_wrong_sign_comparison_fails_it(tmp_path, make_run, wrong, no_pngs):
    """The sat_trial protocol's IUT: the p of "best > each of a, b, c" is the largest of the three p-values, 12/32
    (vs b) whether or not c has the wrong sign; a wrong sign makes it unsupported but does not become the p (an
    earlier version reported the wrong-sign comparison's own two-sided p, here 2/32)."""
    import pandas as pd

    scores = _iut_scores(wrong)
    runs = pd.DataFrame([dict(cell=c, lag=8, seed=s, status="finished", late_test_avg_at_k=v) for (c, s), v in scores.items()])
    t = compare(runs, [("best", b, 8) for b in "abc"], "late_test_avg_at_k")
    assert t["p"].tolist() == pytest.approx([2 / 32, 12 / 32, 2 / 32])
    row = iut_row(t, lower=False)
    assert (row["base"], row["p"], row["wrong_sign"], row["k"]) == ("b", pytest.approx(12 / 32), int(wrong), 3)
    out = tmp_path / "out"
    out.mkdir()
    for (c, s), v in scores.items():
        make_run(out, c, 8, s, {"late_test_avg_at_k": v, "summary_version": 2})
    (out / "grid.yaml").write_text("cells: {a: {}, b: {}, c: {}, best: {}}\nhypotheses:\n"
                                   "  H5: {method: best, base: [a, b, c], lag: 8}\n")
    sec = build_report(out, n_resamples=200).read_text().split("## Declared hypotheses")[1].split("## ")[0]
    assert "| H5 | best > each of a, b, c at lag 8 | `late_test_avg_at_k` | 5 | +0.6 [" in sec and "| 0.375 | 0.375 |" in sec
    assert f"binding: vs b; {int(wrong)} of 3 differences in the wrong direction" in sec


def test_rules_out_says_which_effects_the_interval_excludes():
    assert rules_out(-0.0248, 0.0027) == ("The sign-flip test's 95% interval rules out a gain larger than 0.3 points, "
                                          "and a loss larger than 2.5 points.")
    assert rules_out(0.01, 0.02) == ("The sign-flip test's 95% interval rules out a gain larger than 2.0 points, and "
                                     "any loss (and a gain smaller than 1.0 points).")
    assert rules_out(-0.009, -0.006, lower_better=True) == (
        "The sign-flip test's 95% interval rules out a reduction larger than 0.0090, and any increase (and a "
        "reduction smaller than 0.0060).")
    assert "rule out nothing" in rules_out(-math.inf, math.inf)


@pytest.mark.parametrize("eps_high, below", [(0.2, "50%"), (0.5, "100%")])
def test_report_sat_activity_table(tmp_path, make_run, eps_high, below, no_pngs):
    """SAT can bind only where q < log(1 + eps_high), with the eps_high each run's config.yaml records."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("cells: {grpo: {}, sat: {label: SAT}}\n")
    rows = [{"step": i + 1, "obj/q": q, "obj/sat_clipfrac": 0.01, "obj/gate_rate": 0.1, "gate/tv_share": 0.5}
            for i, q in enumerate([0.1, 0.3, 0.05, 0.4])]  # fmt: skip
    config = f"objective: {{trust_region: {{name: sat, eps_high: {eps_high}}}}}\n"
    for s in range(2):
        make_run(out, "grpo", 8, s, {"best_avg_at_k": 0.3}, metrics=[{"step": 1, "obj/clipfrac": 0.1}])
        make_run(out, "sat", 8, s, {"best_avg_at_k": 0.3}, metrics=rows, config=config)
    md = build_report(out, n_resamples=500).read_text()
    assert "## How much SAT acted" in md
    radius = f"log {1 + eps_high:g}"  # log 1.2: 2 of the 4 q below 0.182; log 1.5: all 4 below 0.405
    assert f"| method | lag | median q | steps with q < {radius} |" in md
    assert f"| SAT | 8 | 0.200 | {below} | 1.00% | 10.0% | 50.0% |" in md
    assert "| grpo | 8 |" not in md.split("## How much SAT acted")[1].split("##")[0]


def test_dose_response_figure_needs_three_lags(tmp_path, make_run):
    out = tmp_path / "out"
    for lag in (1, 2, 8):
        for s in range(2):
            make_run(out, "grpo", lag, s, {"late_test_avg_at_k": 0.6 - 0.01 * lag, "d_pi_last25": 0.001 * lag,
                                           "summary_version": 2})  # fmt: skip
    md = build_report(out, n_resamples=200).read_text()
    assert "![Dose-response: endpoint and d_pi against the lag](figures/dose_response.png)" in md
    assert (out / "figures" / "dose_response.png").stat().st_size > 5000
    few = tmp_path / "few"
    make_run(few, "grpo", 1, 0, {"late_test_avg_at_k": 0.5, "summary_version": 2})
    assert "Skipped: no cell was run at three or more lags" in build_report(few, n_resamples=200).read_text()


def test_report_mismatch_regime_table_uses_last_quarter_of_each_run(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("cells: {grpo: {}}\n")
    for s, late in enumerate([0.02, 0.04]):  # steps 1-3 are early (0.5), step 4 is the last 25 %
        rows = [{"step": i, "mismatch/d_pi": 0.5 if i < 4 else late, "mismatch/frac_impl": 0.4,
                 "obj/clipfrac": 0.01} for i in range(1, 5)]  # fmt: skip
        make_run(out, "grpo", 1, s, {"best_avg_at_k": 0.3}, metrics=rows)
    md = build_report(out, n_resamples=200).read_text()
    section = md.split("## Mismatch regime")[1].split("\n## ")[0]
    assert "| method | lag | d_pi | implementation share | total clip fraction |" in section
    assert "| grpo | 1 | 0.0300 | 40% | 1.00% |" in section  # mean over seeds of each run's late mean


def test_report_says_when_a_grid_is_incomplete(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("seeds: 2\nlags: [1, 8]\ncells: {grpo: {}, sat: {lags: [8]}}\n")
    for cell, lag in (("grpo", 1), ("grpo", 8), ("sat", 8)):
        make_run(out, cell, lag, 0, {"best_avg_at_k": 0.3})
    md = build_report(out, n_resamples=100).read_text()
    assert "**Incomplete: 3 of 6 planned runs finished** (1 complete seed(s) in every cell and lag" in md
    assert "Not finished: grpo/lag1 seed 1; grpo/lag8 seed 1; sat/lag8 seed 1." in md
    for cell, lag in (("grpo", 1), ("grpo", 8), ("sat", 8)):
        make_run(out, cell, lag, 1, {"best_avg_at_k": 0.3})
    assert "Incomplete" not in build_report(out, n_resamples=100).read_text()


def test_incomplete_line_names_missing_seeds_as_ranges(tmp_path, make_run, no_pngs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("seeds: 5\nfirst_seed: 20\nlags: [1]\ncells: {grpo: {}, sat: {seeds: 2}}\n")
    for seed in (20, 22):
        make_run(out, "grpo", 1, seed, {"best_avg_at_k": 0.3})
    md = build_report(out, n_resamples=100).read_text()
    # seeds 21 and 23-24 of grpo are gaps (two ranges); sat plans 2 seeds from first_seed and has none
    assert "Not finished: grpo/lag1 seeds 21, 23-24; sat/lag1 seeds 20-21." in md


def test_paired_eval_diffs_by_hand():
    import numpy as np
    import pandas as pd

    rows = []
    for seed, (a, b) in enumerate([((0.5, 0.6, 0.7), (0.5, 0.7, 0.6)), ((0.4, 0.5, 0.6), (0.4, 0.55, 0.65))]):
        for step, x, y in zip((0, 100, 200), a, b):
            rows += [dict(cell="grpo", lag=8, seed=seed, step=step, test_avg_at_k=x),
                     dict(cell="sat", lag=8, seed=seed, step=step, test_avg_at_k=y)]  # fmt: skip
    rows.append(dict(cell="sat", lag=8, seed=2, step=0, test_avg_at_k=0.9))  # no baseline partner: left out
    d = paired_eval_diffs(pd.DataFrame(rows), "test_avg_at_k", "grpo")
    assert list(d) == [("sat", 8)]
    steps, vals = d["sat", 8]
    assert steps.tolist() == [0, 100, 200]
    np.testing.assert_allclose(vals, [[0.0, 0.1, -0.1], [0.0, 0.05, 0.05]], atol=1e-12)


def test_a_packed_folder_is_rewritten_only_when_out_names_it(grid_out, tmp_path, capsys, monkeypatch, no_pngs):
    """Issue 47: `satrl report docs/results/<grid>` once rewrote the committed report (its provenance line);
    without --out a packed folder's report goes to runs/reports/<name>, and the folder stays byte-identical."""
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    packed = tmp_path / "packed"
    assert run_report(parser.parse_args([str(grid_out), "--out", str(tmp_path / "r1"), "--resamples", "200",
                                         "--pack", str(packed)])) == 0  # fmt: skip
    before = {p: p.read_bytes() for p in sorted(packed.rglob("*")) if p.is_file()}
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert run_report(parser.parse_args([str(packed), "--resamples", "200"])) == 0
    assert "holds packed results: writing to runs/reports/packed" in capsys.readouterr().err
    assert (tmp_path / "runs" / "reports" / "packed" / "report.md").is_file()
    assert {p: p.read_bytes() for p in sorted(packed.rglob("*")) if p.is_file()} == before
    live = tmp_path / "live"
    shutil.copytree(grid_out, live)
    assert run_report(parser.parse_args([str(live), "--resamples", "200"])) == 0  # a live grid: in place
    assert (live / "report.md").is_file()
