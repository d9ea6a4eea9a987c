"""Issue 46, item 5 (in part; each failed before its fix): a run whose every step was skipped (non-finite values:
``train.lr=1e30`` wrecked the weights at step 1 and every later step was skipped) ended with ``collapse = None``.
The skip rule (``collapse.max_skipped_frac``, satrl.diagnostics.collapse) now names it collapsed."""

import contextlib
import io
import json

import pytest
import torch
from pydantic import ValidationError

from run_helpers import TINY
from satrl import cli
from satrl.config import load_config
from satrl.diagnostics import CollapseConfig
from satrl.diagnostics.collapse import skipped_collapse
from satrl.jsonl import write_jsonl
from satrl.rundir.files import RunDir


# -- the rule -------------------------------------------------------------------------------------------------
def test_every_step_skipped_collapses_at_the_first():
    assert skipped_collapse([1, 1, 1, 1]) == 1
    assert skipped_collapse([True] * 3, steps=[5, 6, 7]) == 5


def test_weights_wrecked_by_the_first_step_collapse_where_the_skipping_starts():
    assert skipped_collapse([0, 1, 1, 1]) == 2  # lr=1e30: step 1 applied, every later step skipped


def test_a_few_skipped_steps_are_survivable():
    assert skipped_collapse([0, 1, 0, 0]) is None
    assert skipped_collapse([0, 1, 0, 1]) is None  # half is not more than half
    assert skipped_collapse([]) is None and skipped_collapse([0, 0]) is None


def test_collapse_step_is_where_most_of_the_rest_was_skipped():
    # 6 of 10 skipped: from step 2 on, 6 of 9 steps were skipped (more than half)
    assert skipped_collapse([0, 1, 0, 0, 0, 1, 1, 1, 1, 1]) == 2
    # 6 of 10 skipped: step 1 is a lone skip, but from it on 6 of 10 is still most of the rest
    assert skipped_collapse([1, 0, 0, 0, 0, 1, 1, 1, 1, 1]) == 1
    # 6 of 10 is not more than 0.8
    assert skipped_collapse([0, 0, 0, 1, 0, 1, 1, 1, 1, 1], max_frac=0.8) is None


def test_threshold_is_configurable_and_checked():
    assert skipped_collapse([0, 0, 0, 1], max_frac=0.0) == 4  # any skipped step
    assert skipped_collapse([1, 1, 1, 1], max_frac=1.0) is None  # the rule off
    with pytest.raises(ValidationError, match="max_skipped_frac"):
        skipped_collapse([1], max_frac=1.5)
    with pytest.raises(ValidationError):
        CollapseConfig(max_skipped_frac=-0.1)
    with pytest.raises(ValueError, match="one step per entry"):
        skipped_collapse([1, 1], steps=[1])
    assert load_config(None, ["collapse.max_skipped_frac=0.25"]).collapse.max_skipped_frac == 0.25


# -- the summary ----------------------------------------------------------------------------------------------
def _summary(tmp_path, skipped: list[int], evals: list[dict], **collapse) -> dict:
    """summary.json of a run folder whose metrics log holds ``skipped`` (one flag per step, finite losses)."""
    cfg = load_config(None, [f"out={tmp_path / 'run'}"])
    out = cfg.run_dir()
    out.mkdir(parents=True)
    rows = [
        {"step": i, "loss": 0.1, "train/reward": 0.5, "skipped": float(x)} for i, x in enumerate(skipped, 1)
    ]
    write_jsonl(out / "metrics.jsonl", rows)
    write_jsonl(out / "eval.jsonl", evals)
    run = RunDir(
        out, cfg.model_dump(mode="json"), collapse=CollapseConfig(**collapse), warmup_steps=1, resume=True
    )
    try:
        summary = run.finish(len(skipped))
    finally:
        run.release()
    assert json.loads((out / "summary.json").read_text()) == summary
    return summary


FLAT = [{"step": s, "avg_at_k": 0.25, "val_avg_at_k": 0.25, "test_avg_at_k": 0.25} for s in (0, 4)]


def test_summary_of_a_run_whose_every_step_was_skipped_names_a_collapse(tmp_path):
    s = _summary(tmp_path, [1, 1, 1, 1], FLAT)
    assert s["collapse_step"] == 1 and s["skipped_steps"] == 4 and s["collapse_unconfirmed_step"] is None


def test_summary_keeps_the_earlier_collapse_and_healthy_runs(tmp_path):
    falls = [{"step": s, "val_avg_at_k": v, "test_avg_at_k": v, "avg_at_k": v}
             for s, v in ((0, 0.2), (1, 0.8), (2, 0.1), (3, 0.1), (4, 0.1))]  # fmt: skip
    # the eval rule fires at step 2; skipping 2 of 4 steps is no collapse
    s = _summary(tmp_path / "a", [0, 0, 1, 1], falls)
    assert s["collapse_step"] == 2 and s["skipped_steps"] == 2
    # the skip rule's step is the earlier one
    assert _summary(tmp_path / "b", [1, 1, 1, 1], falls)["collapse_step"] == 1
    assert _summary(tmp_path / "c", [0, 0, 1, 1], FLAT, max_skipped_frac=0.4)["collapse_step"] == 3
    s = _summary(tmp_path / "d", [0, 1, 0, 0], FLAT)
    assert s["collapse_step"] is None and s["skipped_steps"] == 1


# -- end to end: the CLI reports the collapse -----------------------------------------------------------------
def test_run_with_every_step_skipped_reports_a_collapse(tmp_path, monkeypatch):
    """Every gradient non-finite (what a wrecking lr does from step 2 on; config ranges now refuse the issue's
    values, so the guard is forced here): the trainer skips every step, the losses stay finite, and the run
    ends with collapse = 1, not None."""
    from satrl.training.placement import OneDevice

    monkeypatch.setattr(OneDevice, "grads_finite", lambda self, model: torch.zeros((), dtype=torch.bool))
    out = tmp_path / "run"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli.main(["train", *TINY, "steps=4", f"out={out}", "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["collapse_step"] == 1 and "collapse = 1" in stdout.getvalue()
    assert summary["skipped_steps"] == 4
