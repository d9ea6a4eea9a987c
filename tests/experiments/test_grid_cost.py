"""`satrl grid --dry-run`'s cost line: machine-hours spent and left, by hand."""

import json
from pathlib import Path

from test_grid import RUNNER_GRID, _write

from satrl.apps import grid as grid_app
from satrl.experiments.status import cost_line, left_share


def _run(tmp_path: Path, name: str, wall: float | None) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    if wall is not None:
        (d / "summary.json").write_text(json.dumps({"status": "finished", "wall_time_s": wall}))
    return d


def test_cost_line_by_hand(tmp_path):
    runs = [("a", 0, _run(tmp_path, "a0s0", 3600), "finished"), ("a", 0, _run(tmp_path, "a0s1", 5400), "finished"),
            ("a", 0, _run(tmp_path, "a0s2", 9000), "finished"), ("a", 8, _run(tmp_path, "a8s0", 1800), "finished"),
            ("a", 0, _run(tmp_path, "a0s3", None), "new"), ("a", 8, _run(tmp_path, "a8s1", None), "partial"),
            ("b", 0, _run(tmp_path, "b0s0", None), "new")]  # fmt: skip
    # spent: 1 + 1.5 + 2.5 + 0.5 h; left: a/lag0 at its median 1.5 h, a/lag8 at 0.5 h, b (no finished run of its
    # own) at the grid's median over all four finished runs, (1 + 1.5) / 2 = 1.25 h: 3.25 h, 1.1 h at 3 workers
    assert cost_line(runs, 3) == ("4 of 7 runs finished, 5.50 machine-hours spent (their wall_time_s); 3 to run, "
                                  "about 3.25 machine-hours at their cells' median run times (about 1.1 h at "
                                  "--workers 3)")  # fmt: skip
    # a partial run resumes from its checkpoint: a/lag8's, at step 3 of 4, has a quarter of its 0.5 h left
    partial = runs[5][2]
    (partial / "config.yaml").write_text("seed: 1\nsteps: 4\n")
    for step in (2, 3):
        (partial / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    assert left_share(partial) == 0.25 and left_share(runs[4][2]) == 1.0
    assert "3 to run, about 2.88 machine-hours" in cost_line(runs, 3)  # 1.5 + 0.125 + 1.25
    assert cost_line(runs[:4], 1) == "4 of 4 runs finished, 5.50 machine-hours spent (their wall_time_s)"
    assert cost_line(runs[4:], 2) == ("0 of 3 runs finished, 0.00 machine-hours spent (their wall_time_s); 3 to run, "
                                      "no finished run to estimate their cost from")  # fmt: skip


def test_dry_run_prints_the_cost_line(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    path = _write(tmp_path, RUNNER_GRID)
    out = tmp_path / "o"
    done = out / "a" / "lag2" / "seed0"
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"status": "finished", "wall_time_s": 720.0}))
    assert grid_app.run_grid(parser.parse_args([str(path), "--dry-run", "--workers", "2", "--out", str(out)])) == 0
    std = capsys.readouterr()
    assert "[skip] a/lag2/seed0: " in std.out and "[new] a/lag2/seed1: " in std.out
    # 6 runs (cells a, b, bad x 2 seeds), one finished in 0.2 h; the five others at the grid's median, 0.2 h each
    assert std.err.strip() == ("satrl grid g: 1 of 6 runs finished, 0.20 machine-hours spent (their wall_time_s); "
                               "5 to run, about 1.00 machine-hours at their cells' median run times (about 0.5 h at "
                               "--workers 2)")  # fmt: skip
