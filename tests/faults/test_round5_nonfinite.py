"""Issue 60: a NaN or Infinity endpoint in one run's ``summary.json`` is named in one line (exit 2), never dropped
from its cell without a word (before the fix the report's cell mean moved from 50.0 to 75.0 and said nothing)."""

import json

import pytest

from satrl import cli
from satrl.experiments.store import RunFileError, load_runs


def _run(out, cell, lag, seed, text: str) -> None:
    d = out / cell / f"lag{lag}" / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(text)
    (d / "config.yaml").write_text(f"seed: {seed}\n")
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "eval.jsonl").write_text("")


def _grid(tmp_path, bad: str):
    """Cell ``a`` at lag 0: seeds 0 and 1 score 0.25 and 0.75 (mean 50.0); seed 2's endpoint is ``bad``."""
    out = tmp_path / "grid"
    for seed, v in ((0, "0.25"), (1, "0.75"), (2, bad)):
        _run(out, "a", 0, seed, f'{{"status": "finished", "late_test_avg_at_k": {v}, "summary_version": 2}}')
    return out


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nonfinite_endpoint_is_named(tmp_path, bad):
    with pytest.raises(RunFileError) as err:
        load_runs(_grid(tmp_path, bad))
    msg = str(err.value)
    assert "\n" not in msg and "seed2/summary.json" in msg and "late_test_avg_at_k" in msg


def test_nonfinite_nested_number_is_named(tmp_path):
    out = tmp_path / "grid"
    _run(out, "a", 0, 0, json.dumps({"status": "finished", "lag_realized": {"mean": float("nan")}}))
    with pytest.raises(RunFileError, match="lag_realized_mean"):
        load_runs(out)


def test_report_refuses_in_one_line(tmp_path, capsys):
    out = _grid(tmp_path, "NaN")
    assert cli.main(["report", str(out), "--out", str(tmp_path / "rep"), "--resamples", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "late_test_avg_at_k is nan" in err[0], err
    assert not (tmp_path / "rep" / "report.md").exists()


def test_null_endpoint_is_still_read(tmp_path):
    """null is satrl's own "no value" (the writer turns a non-finite score into it): read, not refused."""
    runs = load_runs(_grid(tmp_path, "null"))
    assert runs["late_test_avg_at_k"].isna().tolist() == [False, False, True]
