"""The eval-based collapse rule and the summary's val/test endpoints and realized lag, on hand-made curves."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satrl.diagnostics import CollapseConfig, eval_collapse, realized_lag, summarize_run
from satrl.diagnostics.collapse import eval_collapse_status

STEPS6 = [0, 100, 200, 300, 400, 500]


def test_issue_examples():
    # base 0.30, peak 0.50 -> level 0.40; 0.20 and 0.18 stay below: collapse at the 4th eval's step
    assert eval_collapse(STEPS6, [0.30, 0.40, 0.50, 0.20, 0.18, 0.19]) == 300
    # the same curve cut after 0.50, 0.20: one eval below, unconfirmed
    assert eval_collapse(STEPS6[:4], [0.30, 0.40, 0.50, 0.20]) is None
    assert eval_collapse_status(STEPS6[:4], [0.30, 0.40, 0.50, 0.20]) == (None, 300)
    # recovered: 0.20 is followed by 0.50
    assert eval_collapse(STEPS6[:5], [0.30, 0.50, 0.20, 0.50, 0.50]) is None
    assert eval_collapse_status(STEPS6[:5], [0.30, 0.50, 0.20, 0.50, 0.50]) == (None, None)


def test_level_is_relative_to_base_and_peak():
    # base 0.2, peak 0.6: level 0.4 at frac 0.5. 0.41 is above it (no collapse), 0.39 below it.
    assert eval_collapse([1, 2, 3, 4], [0.2, 0.6, 0.41, 0.41]) is None
    assert eval_collapse([1, 2, 3, 4], [0.2, 0.6, 0.39, 0.39]) == 3
    # frac 0.25: level = 0.2 + 0.75 * 0.4 = 0.5
    assert eval_collapse([1, 2, 3, 4], [0.2, 0.6, 0.45, 0.45], frac=0.25) == 3
    # an explicit base (the step-0 score) instead of the first score
    assert eval_collapse([1, 2, 3], [0.6, 0.3, 0.3], base=0.2) == 2  # level 0.4
    assert eval_collapse([1, 2, 3], [0.6, 0.3, 0.3]) is None  # base 0.6 = peak: never exceeded


def test_never_learned_and_confirm():
    assert eval_collapse([1, 2, 3, 4], [0.3, 0.2, 0.1, 0.0]) is None  # peak never above base
    assert eval_collapse([1, 2, 3, 4], [0.3, 0.5, 0.2, 0.5], confirm=1) == 3
    assert eval_collapse([1, 2, 3, 4, 5], [0.3, 0.5, 0.2, 0.2, 0.5], confirm=3) is None
    assert eval_collapse_status([1, 2, 3, 4], [0.3, 0.5, 0.2, 0.2], confirm=3) == (None, 3)
    assert eval_collapse([], []) is None


def test_bad_input():
    with pytest.raises(ValueError, match="one step per score"):
        eval_collapse([1], [0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        eval_collapse([1, 2], [0.1, float("nan")])
    with pytest.raises(ValueError, match="frac"):
        eval_collapse([1], [0.1], frac=0.0)
    with pytest.raises(ValueError, match="confirm"):
        eval_collapse([1], [0.1], confirm=0)


def _naive(scores, base, frac, confirm):
    """The definition, literally: first s below level(s) with the next confirm-1 evals below it too."""
    base = scores[0] if base is None else base
    for i in range(len(scores)):
        peak = max(scores[: i + 1])
        level = base + (1 - frac) * (peak - base)
        if peak > base and i + confirm <= len(scores) and all(x < level for x in scores[i : i + confirm]):
            return i
    return None


@given(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12),
    st.none() | st.floats(0, 1),
    st.floats(0.05, 1.0),
    st.integers(1, 4),
)
def test_matches_literal_definition(scores, base, frac, confirm):
    i = _naive(scores, base, frac, confirm)
    got = eval_collapse(list(range(len(scores))), scores, base, frac, confirm)
    assert got == i


# ---------------------------------------------------------------------------------------- summary
def _evals(val, test, every=100):
    return [{"step": i * every, "avg_at_k": (v + t) / 2, "val_avg_at_k": v, "test_avg_at_k": t, "k": 8}
            for i, (v, t) in enumerate(zip(val, test))]  # fmt: skip


def test_summary_selects_on_val_reports_on_test():
    # evals at steps 0..400; val peaks at step 200, test peaks at step 100
    val = [0.30, 0.40, 0.60, 0.50, 0.45]
    test = [0.31, 0.70, 0.40, 0.42, 0.44]
    rows = [{"step": s, "train/reward": 0.5, "loss": 0.1} for s in range(1, 401)]
    s = summarize_run(rows, _evals(val, test), CollapseConfig())
    assert s["best_step"] == 200 and s["best_val_avg_at_k"] == 0.60 and s["best_test_avg_at_k"] == 0.40
    assert s["final_test_avg_at_k"] == 0.44
    # 400 steps: the late window is steps 301..400, i.e. the evals at 400 only (300 is before it)
    assert s["late_test_avg_at_k"] == 0.44
    # the pooled score is selected on itself: its maximum (step 200) is not the val-selected test score
    assert math.isclose(s["best_avg_at_k"], 0.55) and math.isclose(s["late_avg_at_k"], 0.445)
    assert s["eval_base"] == 0.30 and s["collapse_score"] == "val_avg_at_k"


def test_summary_late_window_averages_its_evals():
    val = [0.3] * 9
    test = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]  # evals at 0, 50, ..., 400
    s = summarize_run([{"step": 400}], _evals(val, test, every=50), CollapseConfig())
    assert math.isclose(s["late_test_avg_at_k"], (0.8 + 0.9) / 2)  # steps 350 and 400 are >= 301


def test_summary_eval_collapse_on_val_and_nonfinite_loss():
    val = [0.30, 0.40, 0.50, 0.20, 0.18, 0.19]
    s = summarize_run([{"step": 500, "train/reward": 0.5}], _evals(val, val), CollapseConfig())
    assert s["collapse_step"] == 300 and s["reward_collapse_step"] is None
    rows = [{"step": 1, "loss": 0.1}, {"step": 2, "loss": float("nan")}]
    s = summarize_run(rows, _evals(val, val), CollapseConfig())
    assert s["collapse_step"] == 2  # the non-finite loss comes first


def test_realized_lag_one_step_per_batch():
    # broadcast n=1, one optimizer step per batch: batch 0 (step 1) at lag 0, every later batch at lag 1
    rows = [{"step": 1, "lag/mean": 0.0, "lag/min": 0.0, "lag/max": 0.0, "train/tokens": 8.0}]
    rows += [{"step": s, "lag/mean": 1.0, "lag/min": 1.0, "lag/max": 1.0, "train/tokens": 8.0} for s in range(2, 50)]
    assert realized_lag(rows, warmup_steps=1) == {"mean": 1.0, "min": 1.0, "max": 1.0}
    assert realized_lag(rows)["min"] == 0.0  # with the warm-up batch
    # broadcast n=8: batch b >= 1 is generated by version 8 * floor((b - 1) / 8): lags 1..8, mean 4.5
    lag = [0] + [b - 8 * ((b - 1) // 8) for b in range(1, 65)]
    rows = [{"step": b + 1, "lag/mean": float(x), "lag/min": float(x), "lag/max": float(x), "train/tokens": 8.0}
            for b, x in enumerate(lag)]  # fmt: skip
    assert realized_lag(rows, warmup_steps=1) == {"mean": 4.5, "min": 1.0, "max": 8.0}


def test_realized_lag_token_weights():
    rows = [{"step": 1, "lag/mean": 1.0, "train/tokens": 30.0, "lag/max": 1.0, "lag/min": 1.0},
            {"step": 2, "lag/mean": 3.0, "train/tokens": 10.0, "lag/max": 4.0, "lag/min": 2.0}]  # fmt: skip
    assert realized_lag(rows) == {"mean": 1.5, "min": 1.0, "max": 4.0}
    assert realized_lag([{"step": 1}]) is None
