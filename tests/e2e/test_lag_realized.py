"""The paper's lag, end to end: with one optimizer step per rollout batch, configured broadcast lag n trains every
batch after the first at lags 1..n, and summary.json's lag_realized says so. With two steps per batch it does not."""

import json

import pytest

from run_helpers import read_jsonl


@pytest.mark.parametrize("n, steps, expected", [(1, 6, (1.0, 1.0, 1.0)), (8, 17, (1.0, 8.0, 4.5))])
def test_one_step_per_batch_gives_the_paper_lag(run_tiny, n, steps, expected):
    out = run_tiny(f"steps={steps}", "lag.schedule=broadcast", f"lag.n={n}", "train.minibatches=1")
    lag = json.loads((out / "summary.json").read_text())["lag_realized"]
    assert (lag["min"], lag["max"]) == expected[:2]
    # batch b >= 1 trains at lag b - 8 * floor((b - 1) / 8): 1..8, each equally often over 16 batches; the
    # mean is token-weighted, so responses of different lengths move it a little off the step mean 4.5
    assert lag["mean"] == pytest.approx(expected[2], abs=0.05)
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows[0]["lag/max"] == 0.0  # the first batch comes from the initial weights: warm-up, left out
    assert all(r["lag/min"] == r["lag/max"] for r in rows)  # one version per batch under broadcast


def test_several_steps_per_batch_realize_larger_lags(run_tiny):
    out = run_tiny("steps=8", "lag.schedule=broadcast", "lag.n=1", "train.minibatches=2")
    lag = json.loads((out / "summary.json").read_text())["lag_realized"]
    assert (lag["min"], lag["max"]) == (2.0, 3.0)  # configured lag 1, realized 2-3: S + n - 1 .. 2S + n - 2


def test_eval_has_val_and_test_and_a_step_zero_base(run_tiny):
    out = run_tiny("steps=4", "eval.every=2", "eval.val_problems=3", "eval.test_problems=4")
    ev = read_jsonl(out / "eval.jsonl")
    assert [e["step"] for e in ev] == [0, 2, 4]
    assert all((e["val_n"], e["test_n"]) == (3, 4) for e in ev)
    # the pooled score is the problem-weighted mean of the two parts
    assert all(abs(e["avg_at_k"] - (3 * e["val_avg_at_k"] + 4 * e["test_avg_at_k"]) / 7) < 1e-12 for e in ev)
    s = json.loads((out / "summary.json").read_text())
    best = max(ev, key=lambda e: (e["val_avg_at_k"], -e["step"]))
    assert s["best_step"] == best["step"] and s["best_test_avg_at_k"] == best["test_avg_at_k"]
    assert s["late_test_avg_at_k"] == ev[-1]["test_avg_at_k"]  # 4 steps: the late window is step 4 only
    assert s["eval_base"] == ev[0]["val_avg_at_k"] and s["summary_version"] == 2
