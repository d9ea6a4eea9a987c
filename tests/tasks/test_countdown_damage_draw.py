"""The countdown damage test's evaluation (docs/results/countdown_damage/protocol.md): its grid's runs score 80 val,
100 test and, late, 500 test problems of a draw that shares none with draw 0 (the base's pretraining score) or the
calibration's draw 6000, and none is a training problem."""

from __future__ import annotations

import statistics
from itertools import islice
from pathlib import Path

from satrl.config import load_config
from satrl.experiments.spec import expand, load_grid
from satrl.tasks import make_task
from satrl.tasks.countdown_trace import parse_prompt
from satrl.tasks.evaluate import split_val_test

REPO = Path(__file__).resolve().parents[2]


def _key(p):
    numbers, target = parse_prompt(p.prompt)
    return tuple(sorted(numbers)), target


def test_the_damage_tests_draw_is_fresh_and_fits_its_late_evaluations(tmp_path):
    spec = load_grid(REPO / "configs" / "grids" / "countdown_damage.yaml")
    runs = expand(spec, tmp_path)
    assert sorted({r.seed for r in runs}) == list(range(70, 80)) and sorted({r.lag for r in runs}) == [0, 128]
    cfg = load_config(runs[0].base, [*runs[0].overrides, f"seed={runs[0].seed}", f"out={tmp_path / 'r'}"])
    e = cfg.eval
    assert (e.val_problems, e.test_problems, e.late_test_problems, e.problem_seed) == (80, 100, 500, 7000)
    task = make_task(cfg.task.name, **cfg.task_kwargs)
    pool, val, test = split_val_test(task.problems("eval", 0), e.val_problems, e.late_test_problems)
    assert (len(val), len(test)) == (80, 500)
    used = {_key(p) for p in pool}
    draw0 = {_key(p) for p in make_task("countdown_trace").problems("eval", 0)}
    calibration = make_task("countdown_trace", eval_seed=6000, exclude_eval_seeds=[0])  # as the calibration ran it
    draw6000 = {_key(p) for p in calibration.problems("eval", 0)}
    assert not used & draw0 and not used & draw6000
    train = {_key(p) for p in islice(task.problems("train", 70), 5000)}
    assert not used & train
    # as hard as a plain draw: excluding the earlier draws at their own size (256), not at this draw's 1024, keeps
    # the mean reference trace near a plain draw's (75.5 characters); at 1024 each it was 110
    plain = statistics.fmean(len(p.answer) for p in make_task("countdown_trace", eval_seed=7000).problems("eval", 0))
    ours = statistics.fmean(len(p.answer) for p in pool)
    assert abs(ours / plain - 1) < 0.05, (ours, plain)


def test_excluded_draws_are_taken_at_the_size_they_were_drawn_with():
    small = make_task("countdown_trace", n_eval=64, eval_seed=5, exclude_eval_seeds=[0], exclude_n_eval=32)
    first32 = {_key(p) for p in list(make_task("countdown_trace", n_eval=32).problems("eval", 0))}
    first256 = {_key(p) for p in make_task("countdown_trace").problems("eval", 0)}
    keys = {_key(p) for p in small.problems("eval", 0)}
    assert not keys & first32 and keys & (first256 - first32)  # only the 32 it names are left out
