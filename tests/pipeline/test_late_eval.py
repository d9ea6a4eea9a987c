"""``eval.late_test_problems``: the evaluations in the endpoint's late window score more test problems (the first
``eval.test_problems`` of them the other evaluations' own), the others are unchanged, and a smaller count is refused."""

from __future__ import annotations

import json

import pytest

from satrl.config_base import ConfigError
from satrl.diagnostics.summary import late_window_start
from satrl.launch.setup import build_evaluator
from satrl.tasks import make_task


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_late_window_evaluations_score_more_test_problems(run_tiny):
    run = run_tiny("steps=8", "eval.every=2", "eval.late_test_problems=5")
    evals = {e["step"]: e for e in _rows(run / "eval.jsonl")}
    start = late_window_start(8)  # steps 7-8: ceil(25 %) of 8
    assert start == 7 and sorted(evals) == [0, 2, 4, 6, 8]
    assert [evals[s]["test_n"] for s in (0, 2, 4, 6)] == [2, 2, 2, 2]  # before the window: eval.test_problems
    assert evals[8]["test_n"] == 5 and evals[8]["val_n"] == 2  # val untouched
    summary = json.loads((run / "summary.json").read_text())
    assert summary["late_test_avg_at_k"] == pytest.approx(evals[8]["test_avg_at_k"])


def test_late_test_problems_extend_the_test_part_in_order(tiny_cfg):
    cfg = tiny_cfg("steps=8", "eval.test_problems=3", "eval.late_test_problems=7")
    task = make_task(cfg.task.name, **cfg.task_kwargs)
    evaluator = build_evaluator(cfg, tokenizer=None, task=task)
    evaluator.prepare()
    (pool, _, test), (late_pool, _, late_test) = evaluator.parts[False], evaluator.parts[True]
    early, late = [pool[i].prompt for i in test], [late_pool[i].prompt for i in late_test]
    assert len(early) == 3 and len(late) == 7 and late[:3] == early
    assert evaluator.pool is late_pool  # the context check sees every problem any evaluation prompts with
    assert [evaluator.plan.is_late(s) for s in (0, 6, 7, 8)] == [False, False, True, True]


def test_unset_late_test_problems_keeps_one_draw(tiny_cfg):
    evaluator = build_evaluator(tiny_cfg("steps=8"), tokenizer=None, task=make_task("arithmetic"))
    evaluator.prepare()
    assert list(evaluator.parts) == [False] and not evaluator.plan.is_late(8)


def test_fewer_late_than_test_problems_is_refused_naming_both_fields(tiny_cfg):
    with pytest.raises(ConfigError, match=r"eval.late_test_problems=1 is below eval.test_problems=2"):
        tiny_cfg("eval.late_test_problems=1")


def test_a_late_draw_the_task_cannot_fill_names_the_late_field(tiny_cfg):
    from satrl.tasks import TaskError

    cfg = tiny_cfg("eval.late_test_problems=1000", "task.kwargs.n_eval=50")
    evaluator = build_evaluator(cfg, tokenizer=None, task=make_task(cfg.task.name, **cfg.task_kwargs))
    with pytest.raises(TaskError, match=r"eval.late_test_problems=1000"):
        evaluator.prepare()
