import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from satrl.diagnostics import CollapseConfig, detect_collapse, summarize_run

FALL = [0.2, 0.4, 0.6, 0.6, 0.1, 0.1, 0.1, 0.1]
# window 2 -> R at steps 2..8 = [.3, .5, .6, .35, .1, .1, .1]; R* = .6 from step 4; .5 * R* = .3.
# Step 5 (R = .35) is still above; from step 6 on R = .1 for good -> collapse at step 6.


def test_fall_and_stay_down_collapses_at_the_right_step():
    assert detect_collapse(FALL, window=2) == 6
    assert detect_collapse(FALL, window=2, steps=[10 * i for i in range(1, 9)]) == 60


def test_dip_and_recover_is_not_collapse():
    dip = [0.2, 0.4, 0.6, 0.6, 0.1, 0.1, 0.6, 0.6]  # R = [.3, .5, .6, .35, .1, .35, .6]
    assert detect_collapse(dip, window=2) is None


def test_reaching_exactly_drop_times_peak_counts_as_recovered():
    assert detect_collapse([1.0, 0.25, 0.5], window=1) is None
    assert detect_collapse([1.0, 0.25, 0.4375], window=1) == 2


def test_peak_rising_after_a_dip_moves_the_bar():
    # step 2 dips below .5 * .5 but step 3 recovers (to a new peak 1.0); step 4 falls below .5 * 1.0 for good
    assert detect_collapse([0.5, 0.2, 1.0, 0.2], window=1) == 4


def test_min_peak_guard():
    never_learned = [0.04, 0.0, 0.0, 0.0]
    assert detect_collapse(never_learned, window=1, min_peak=0.05) is None
    assert detect_collapse(never_learned, window=1, min_peak=0.01) == 2


def test_nonfinite_loss_is_collapse_earliest_wins():
    healthy = [0.5] * 10
    assert detect_collapse(healthy, nonfinite_steps=[7, 5], window=2) == 5
    assert detect_collapse(FALL, nonfinite_steps=[7], window=2) == 6
    assert detect_collapse(FALL, nonfinite_steps=[3], window=2) == 3


def test_short_run_and_bad_inputs():
    assert detect_collapse([0.9, 0.0], window=10) is None
    assert detect_collapse([], window=3) is None
    with pytest.raises(ValueError, match="finite"):
        detect_collapse([0.5, float("nan")], window=1)
    with pytest.raises(ValueError, match="steps"):
        detect_collapse([0.5, 0.4], steps=[1])


@pytest.mark.parametrize(
    "kw", [{"window": 0}, {"drop": 1.0}, {"drop": 0.0}, {"min_peak": -0.1}, {"windw": 3}]
)
def test_collapse_config_validation(kw):
    with pytest.raises(ValidationError):
        CollapseConfig(**kw)
    if "windw" not in kw:
        with pytest.raises(ValueError):
            detect_collapse([0.1], **kw)


def _naive_collapse(rewards, window, drop, min_peak):
    """The definition, literally: O(n²)."""
    r = [sum(rewards[i - window + 1 : i + 1]) / window for i in range(window - 1, len(rewards))]
    for s in range(len(r)):
        peak = max(r[: s + 1])
        if peak >= min_peak and all(x < drop * peak for x in r[s:]):
            return s + window  # 1-based step at which window s ends
    return None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 0.75, 1.0]), max_size=30),
    st.integers(1, 5),
    st.sampled_from([0.25, 0.5, 0.75]),
    st.sampled_from([0.0, 0.05, 0.5]),
)
def test_detect_collapse_matches_literal_definition(rewards, window, drop, min_peak):
    assert detect_collapse(rewards, window=window, drop=drop, min_peak=min_peak) == _naive_collapse(
        rewards, window, drop, min_peak
    )


def _rows():
    rewards = FALL + [0.1]  # 9 steps, collapse at step 6 with window 2
    rows = [
        {"step": i, "train/reward": r, "loss": 0.1, "mismatch/d_pi": 0.01 * i, "obj/gate_rate": 0.1}
        for i, r in enumerate(rewards, start=1)
    ]
    rows[7]["mismatch/d_pi"] = float("nan")  # step 8: ignored in d_pi_last25
    del rows[2]["obj/gate_rate"]
    rows[3]["obj/gate_rate"] = 0.3
    # a resumed run re-logged step 5: the last row for a step wins
    rows.insert(5, dict(rows[4], **{"obj/gate_rate": 0.2}))
    rows[4]["obj/gate_rate"] = 99.0
    return rows


EVALS = [
    {"step": 3, "avg_at_k": 0.5, "greedy_acc": 0.5, "k": 8},
    {"step": 6, "avg_at_k": 0.75, "greedy_acc": 0.5, "k": 8},
    {"step": 7, "avg_at_k": 0.75, "greedy_acc": 0.5, "k": 8},
    {"step": 9, "avg_at_k": 0.25, "greedy_acc": 0.5, "k": 8},
]


def test_summarize_run_hand_written_rows():
    s = summarize_run(_rows(), EVALS, CollapseConfig(window=2))
    assert s["best_avg_at_k"] == 0.75 and s["best_step"] == 6  # earliest of the tie
    assert s["final_avg_at_k"] == 0.25
    assert s["reward_collapse_step"] == 6  # the training-reward rule
    # the eval rule: base 0.5, peak 0.75, level 0.625; only the last eval (step 9) is below: unconfirmed
    assert s["collapse_step"] is None and s["collapse_unconfirmed_step"] == 9
    # 9 steps -> last ceil(9/4) = 3 steps: 7, 8, 9; step 8 is NaN -> mean(0.07, 0.09)
    assert math.isclose(s["d_pi_last25"], 0.08)
    # gate_rate present on 8 of 9 steps: 0.1 * 6 + 0.3 (step 4) + 0.2 (re-logged step 5) -> / 8
    assert math.isclose(s["gate_rate_mean"], (0.6 + 0.3 + 0.2) / 8)
    assert s["steps"] == 9


def test_summarize_run_nonfinite_loss_missing_keys_and_empty():
    rows = [{"step": i, "train/reward": 0.5, "loss": 0.2, "mismatch/d_pi": 0.01} for i in range(1, 6)]
    rows[3]["loss"] = float("inf")
    del rows[1]["train/reward"]
    s = summarize_run(rows, [], CollapseConfig())
    assert s["collapse_step"] == 4
    assert s["best_avg_at_k"] is None and s["best_step"] is None and s["final_avg_at_k"] is None
    assert s["gate_rate_mean"] is None  # non-SAT run
    assert math.isclose(s["d_pi_last25"], 0.01) and s["steps"] == 5
    empty = summarize_run([], [], CollapseConfig())
    assert empty == {
        **dict.fromkeys(("best_avg_at_k", "best_step", "final_avg_at_k", "late_avg_at_k", "best_val_avg_at_k",
                         "best_test_avg_at_k", "late_test_avg_at_k", "final_test_avg_at_k")),  # fmt: skip
        **dict.fromkeys(("collapse_step", "collapse_unconfirmed_step", "collapse_score", "reward_collapse_step")),
        "eval_base": None,
        "lag_realized": None,
        "d_pi_last25": None,
        "gate_rate_mean": None,
        "steps": 0,
        "summary_version": 2,
    }


def test_summarize_run_reads_d_pi_from_the_diagnostics():
    """Runs since the objective dropped obj/d_pi record the one d_pi as mismatch/d_pi (satrl.diagnostics); the
    summary's d_pi_last25 must come from it, not silently become None."""
    rows = [{"step": i, "train/reward": 0.5, "loss": 0.2, "mismatch/d_pi": 0.01 * i} for i in range(1, 9)]
    s = summarize_run(rows, [], CollapseConfig())
    assert s["d_pi_last25"] is not None and math.isclose(s["d_pi_last25"], 0.075)  # steps 7, 8
