"""Issue 60, hostile run files: a string in ``eval.jsonl`` at a scored step, and a ``state.json`` nested 200k
levels deep. Before the fix the first was skipped without a word on ``--resume`` (the best checkpoint moved) and a
traceback in ``satrl report`` and ``satrl eval RUN_DIR``; the second a RecursionError traceback. Each is now one
line naming the file (exit 2), the folder untouched."""

import json
import shutil

import pytest

from run_helpers import refused_resume
from satrl.apps.runs import logged_eval
from satrl.cli import main
from satrl.diagnostics.summary import score_problem
from satrl.jsonl import loads

DEEP = "[" * 200_000 + "]" * 200_000


@pytest.fixture
def run(shared_tiny, tmp_path):
    """A copy of a finished 2-step tiny run (evaluated at steps 0 and 2, checkpoints at steps 1 and 2)."""
    out = tmp_path / "run"
    shutil.copytree(shared_tiny("steps=2", "eval.every=2"), out)
    return out


def _set_score(out, index: int, key: str, value) -> None:
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    rows[index][key] = value
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("value", ["high", [0.5], True])
def test_score_that_is_not_a_number(value):
    assert "val_avg_at_k" in score_problem({"step": 0, "val_avg_at_k": value, "k": 2})
    assert score_problem({"step": 0, "val_avg_at_k": 0.5, "test_avg_at_k": None, "k": 2}) is None


def test_resume_refuses_a_string_at_a_scored_step(run):
    _set_score(run, 0, "val_avg_at_k", "high")
    line = refused_resume(run, "steps=4")
    assert f"{run / 'eval.jsonl'}:1: val_avg_at_k is 'high', not a number" in line, line


def test_eval_of_a_run_skips_a_logged_row_that_is_not_a_number(run):
    _set_score(run, 1, "test_avg_at_k", "high")
    assert logged_eval(run, 2) is None and logged_eval(run, 0)["step"] == 0


def test_report_refuses_a_string_in_eval_log(run, tmp_path, capsys):
    grid = tmp_path / "grid" / "a" / "lag0" / "seed0"
    grid.parent.mkdir(parents=True)
    shutil.copytree(run, grid)
    _set_score(grid, 1, "test_avg_at_k", "high")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "grid"), "--out", str(tmp_path / "rep"), "--resamples", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{grid / 'eval.jsonl'}:2: test_avg_at_k is 'high'" in err[0], err


def test_deep_json_is_a_value_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        loads(DEEP)


def _deep_state(run):
    ckpt = run / "checkpoints" / "step-000002"
    (ckpt / "manifest.json").unlink()  # the format before the manifest: state.json is parsed to be checked
    (ckpt / "state.json").write_text(DEEP)
    return ckpt


def test_resume_refuses_a_deeply_nested_state_json(run):
    ckpt = _deep_state(run)
    line = refused_resume(run, "steps=4")
    assert str(ckpt) in line and "state.json" in line, line


def test_export_refuses_a_deeply_nested_state_json(run, tmp_path, capsys):
    ckpt = _deep_state(run)
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ckpt) in err[0] and "Traceback" not in err[0], err
