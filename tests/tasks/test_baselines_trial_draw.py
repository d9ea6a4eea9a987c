"""The baselines trial's evaluation (docs/results/baselines_trial/protocol.md): its grid's runs score 80 val, 100 test
and, late, 800 test problems of a draw that shares none with the draws every earlier arithmetic trial was scored on
(0, 1000, 3000; 2026 an earlier test's recommendation), and none is a training problem."""

from __future__ import annotations

from pathlib import Path

from satrl.config import load_config
from satrl.experiments.spec import expand, load_grid
from satrl.tasks import make_task
from satrl.tasks.evaluate import split_val_test

REPO = Path(__file__).resolve().parents[2]


def test_the_baselines_trials_draw_is_fresh_and_fits_its_late_evaluations(tmp_path):
    runs = expand(load_grid(REPO / "configs" / "grids" / "baselines_trial.yaml"), tmp_path)
    assert sorted({r.seed for r in runs}) == list(range(100, 129)) and len(runs) == 29 * 8
    run = runs[0]
    cfg = load_config(run.base, [*run.overrides, f"seed={run.seed}", f"out={tmp_path / 'r'}"])
    e = cfg.eval
    assert (e.val_problems, e.test_problems, e.late_test_problems, e.problem_seed) == (80, 100, 800, 5000)
    task = make_task(cfg.task.name, **cfg.task_kwargs)
    pool, val, test = split_val_test(task.problems("eval", 0), e.val_problems, e.late_test_problems)
    assert (len(val), len(test)) == (80, 800)
    used = {p.prompt for p in pool}
    for seed in (0, 1000, 2026, 3000):
        assert not used & {p.prompt for p in make_task("arithmetic", eval_seed=seed).problems("eval", 0)}, seed
    assert all(task.split_of(int(p[:3]), p[3], int(p[4:7])) == "eval" for p in used)  # never a training problem
