"""Issue 34, item 3: a grid's identity of a run is its fully resolved config, base file included, so a rerun
after an edited base.yaml neither skips the old runs as done nor pools them with new ones (failed before the fix:
only the grid's own keys were compared)."""

import yaml

from satrl.config import load_config
from satrl.experiments.changes import changed_runs
from satrl.experiments.grid import expand, load_grid
from satrl.experiments.spec import spec_to_yaml


def test_an_edited_base_file_changes_the_runs_made_with_it(tmp_path):
    base, grid = tmp_path / "base.yaml", tmp_path / "g.yaml"
    base.write_text("train: {lr: 0.0001}\n")
    grid.write_text("base: base.yaml\nlags: [2]\nseeds: 1\nsteps: 4\ncells: {a: {objective.name: grpo}}\n")
    spec, out = load_grid(grid), tmp_path / "out"
    (run,) = expand(spec, out)
    made = load_config(run.base, [*run.overrides, f"seed={run.seed}", f"out={run.run_dir}", "train.max_threads=1"])
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(made.model_dump(mode="json"), sort_keys=False))
    (run.run_dir / "summary.json").write_text('{"status": "finished"}')
    (out / "grid.yaml").write_text(spec_to_yaml(spec, 1))
    assert changed_runs(spec, out, 2)[:2] == ([], [])  # the runner's own out= and thread cap are no change
    base.write_text("train: {lr: 0.001}\n")
    runs, diffs, _ = changed_runs(load_grid(grid), out, 2)
    assert [r.name for r in runs] == ["a/lag2/seed0"] and diffs == ["train.lr: 0.0001 -> 0.001"]


def test_rerun_changed_with_only_moves_nothing_it_would_not_rerun(tmp_path):
    """Item 9: `--rerun-changed --only X` moved every changed run aside but reran X alone; now it refuses
    (one line naming a changed run outside --only) and moves nothing."""
    import pytest

    from satrl.experiments.changes import GridChangedError, guard_changes

    base, grid = tmp_path / "base.yaml", tmp_path / "g.yaml"
    base.write_text("{}\n")
    grid.write_text("base: base.yaml\nlags: [2]\nseeds: 2\nsteps: 4\ncells: {a: {objective.name: grpo}}\n")
    spec, out = load_grid(grid), tmp_path / "out"
    for run in expand(spec, out):
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "config.yaml").write_text("steps: 4\n")
        (run.run_dir / "summary.json").write_text('{"status": "finished"}')
    (out / "grid.yaml").write_text(spec_to_yaml(spec, 2))
    edited = load_grid(grid.write_text(grid.read_text().replace("steps: 4", "steps: 6")) and grid)
    with pytest.raises(GridChangedError, match=r"a/lag2/seed1.*--only"):
        guard_changes(edited, out, None, rerun_changed=True, only=["a/lag2/seed0"])
    assert all(r.run_dir.is_dir() for r in expand(spec, out))  # nothing moved
