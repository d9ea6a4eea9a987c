"""Declared leaderboards (a staged trial's screen and confirmation) and hypotheses restricted to a seed range."""

import textwrap

import pytest

from satrl.experiments.report import build_report
from satrl.experiments.spec import load_grid

GRID = """
    cells: {grpo: {lags: [0, 32], label: GRPO}, good: {lags: [32], label: Good}, bad: {lags: [32], label: Bad}}
    hypotheses:
      P1: {method: good, base: grpo, lag: 32, seeds: [4, 9], family: confirm}
    leaderboards:
      - {title: Screen, base: grpo, lag: 32, reference_lag: 0, seeds: [0, 3], select_on: late_val_avg_at_k}
"""


def _evals(val: float, test: float) -> list[dict]:
    return [{"step": s, "k": 8, "val_avg_at_k": val, "test_avg_at_k": test, "avg_at_k": (val + test) / 2}
            for s in (0, 500, 600)]  # fmt: skip


@pytest.fixture
def out(tmp_path, make_run):
    """GRPO loses 4 points from lag 0 to lag 32 on every seed; `good` repairs exactly half of it on test, `bad`
    loses 1 more point. On validation the order is the other way round (bad +1, good -1), so a screen that
    ranked on test would order them differently than one that ranks on validation."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(10):
        g0, g32 = 0.80 + 0.002 * s, 0.76 + 0.002 * s
        for cell, lag, test, val in (("grpo", 0, g0, 0.7), ("grpo", 32, g32, 0.6), ("good", 32, g32 + 0.02, 0.59),
                                     ("bad", 32, g32 - 0.01, 0.61)):  # fmt: skip
            make_run(out, cell, lag, s, {"late_test_avg_at_k": test, "summary_version": 2}, evals=_evals(val, test))
    return out


def test_screen_ranks_on_validation_and_reports_test_with_repaired_fraction(out):
    md = build_report(out, n_resamples=200).read_text()
    sec = md.split("## Leaderboard: Screen")[1].split("\n## ")[0]
    table = [line for line in sec.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[1] for line in table] == ["Bad", "GRPO", "Good"]  # val: +1, 0 (the base), -1
    good = next(line for line in table if "| Good |" in line)
    assert "| 4 |" in good and "+2.0 [" in good and "4/4" in good and "+0.50 [+0.50, +0.50]" in good
    assert good.endswith(" -1.0 |")  # its validation selection score, paired with GRPO's
    bad = next(line for line in table if "| Bad |" in line)
    assert "-1.0 [" in bad and "0/4" in bad and "-0.25 [-0.25, -0.25]" in bad and bad.endswith(" +1.0 |")
    assert "(the base)" in next(line for line in table if "| GRPO |" in line)
    assert (out / "figures" / "leaderboard_0.png").stat().st_size > 1000


def test_the_screens_validation_score_reads_its_own_seeds_only(tmp_path, make_run):
    """A confirmation's later seeds (here 4-9, where `good` leads on validation by 39 points) must not enter the
    screen's selection score: the promotion rule names the screen's seeds."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(10):
        good_val = 0.59 if s < 4 else 0.99
        for cell, lag, val in (("grpo", 0, 0.7), ("grpo", 32, 0.6), ("good", 32, good_val), ("bad", 32, 0.61)):
            make_run(out, cell, lag, s, {"late_test_avg_at_k": 0.7, "summary_version": 2}, evals=_evals(val, 0.7))
    sec = build_report(out, n_resamples=200).read_text().split("## Leaderboard: Screen")[1].split("\n## ")[0]
    table = [line for line in sec.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[1] for line in table] == ["Bad", "GRPO", "Good"]
    assert next(line for line in table if "| Good |" in line).endswith(" -1.0 |")


def test_a_hypothesis_with_seeds_is_tested_on_those_seeds_only(out):
    md = build_report(out, n_resamples=200).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| P1 |"))
    assert "seeds 4-9" in row and "| 6 |" in row  # n = 6 seeds, not 10
    assert "0.0312 | 0.0312 |" in row  # 6 of 6 positive: exact two-sided p = 2 / 2**6


def test_a_leaderboard_must_name_a_base_that_runs_both_lags(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: x.yaml\nlags: [32]\ncells: {a: {}}\n"
                   "leaderboards: [{title: t, base: a, lag: 32, reference_lag: 0}]\n")  # fmt: skip
    with pytest.raises(ValueError, match="leaderboards.0.base: cell 'a' does not run lag 0"):
        load_grid(bad, check_paths=False)
    bad.write_text("base: x.yaml\nlags: [32]\ncells: {a: {}}\nhypotheses: {H: {method: a, base: a, lag: 32, "
                   "seeds: [9, 3]}}\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"first <= last, got \[9, 3\]"):
        load_grid(bad, check_paths=False)
