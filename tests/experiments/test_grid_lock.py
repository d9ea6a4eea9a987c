"""Issue 46, item 1: one grid per --out (a second exits 2 naming the first's pid; the lock goes however the grid
ends, and a killed grid's is taken over); a run's files are cleared only under that run's lock, so a run another
process trains in is left untouched; a lag listed twice or a cell given twice is refused."""

import argparse
import fcntl
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from satrl.apps import grid as grid_app
from satrl.experiments import grid as grid_mod
from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.folders import GRID_LOCK, LOCK


def _grid(tmp_path: Path, cells: str = "{a: {sleep: 0}}", lags: str = "[1]", seeds: int = 1) -> Path:
    (tmp_path / "base.yaml").write_text("steps: 8\n")
    path = tmp_path / "g.yaml"
    path.write_text(f"base: base.yaml\nlags: {lags}\nseeds: {seeds}\ncells: {cells}\n")
    return path


def _cli(capsys, *argv: str) -> tuple[int, list[str]]:
    """`satrl grid *argv` in this process: its exit code and its stderr lines."""
    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    capsys.readouterr()
    rc = grid_app.run_grid(parser.parse_args(list(argv)))
    return rc, capsys.readouterr().err.strip().splitlines()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_grid_on_one_out_is_refused_while_the_first_runs(tmp_path, fake_trainer, capsys):
    command, _ = fake_trainer
    path, out = _grid(tmp_path, "{a: {sleep: 3}}"), tmp_path / "out"
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        from satrl.experiments.grid import default_command, load_grid, run_grid_spec
        def command(run, resume):
            return [sys.executable, {str(tmp_path / "fake_train.py")!r}, *default_command(run, resume)[4:]]
        res = run_grid_spec(load_grid({str(path)!r}), {str(out)!r}, command_fn=command, progress=False)
        sys.exit(res.exit_code)
    """))
    first = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run = out / "a" / "lag1" / "seed0"
    deadline = time.monotonic() + 60
    while not (run / "pid").exists() and time.monotonic() < deadline:  # the first grid's run is training
        time.sleep(0.05)
    before = _tree(run)
    with pytest.raises(ValueError, match=f"satrl grid process {first.pid} is running a grid"):  # GridBusyError
        run_grid_spec(load_grid(path), out, command_fn=command, progress=False)
    rc, err = _cli(capsys, str(path), "--out", str(out))
    assert rc == 2 and len(err) == 1 and str(first.pid) in err[0] and str(out) in err[0], err
    assert _tree(run) == before, "the second grid touched the run the first is training"
    assert first.wait(timeout=120) == 0, first.stdout.read().decode()[-2000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    assert not (out / GRID_LOCK).exists()  # released at the end: the next grid runs
    assert run_grid_spec(load_grid(path), out, command_fn=command, progress=False).names("skipped") == ["a/lag1/seed0"]


def test_a_killed_grids_lock_is_taken_over_and_an_error_releases_it(tmp_path, fake_trainer):
    command, _ = fake_trainer
    path, out = _grid(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / GRID_LOCK).write_text("999999\n")  # SIGKILLed: its file stays, its flock went with it
    assert run_grid_spec(load_grid(path), out, command_fn=command, progress=False).exit_code == 0
    assert not (out / GRID_LOCK).exists()
    edited = _grid(tmp_path, "{a: {sleep: 0.1}}")  # the run was made with other settings
    with pytest.raises(grid_mod.GridChangedError):
        run_grid_spec(load_grid(edited), out, command_fn=command, progress=False)
    assert not (out / GRID_LOCK).exists()


def test_a_run_another_process_trains_in_is_left_untouched(tmp_path, fake_trainer):
    """Before the fix the runner cleared every run without a checkpoint before its child took the run's
    lock: the logs of a `satrl train` started by hand (no checkpoint yet) were deleted under it."""
    command, log = fake_trainer
    path, out = _grid(tmp_path, seeds=2), tmp_path / "out"
    busy = out / "a" / "lag1" / "seed0"
    busy.mkdir(parents=True)
    for name, text in {"config.yaml": "seed: 0\n", "metrics.jsonl": '{"step": 1}\n', "eval.jsonl": '{"step": 0}\n'}.items():
        (busy / name).write_text(text)
    with open(busy / LOCK, "a+") as held:  # the process training in it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("424242\n")
        held.flush()
        before = _tree(busy)
        res = run_grid_spec(load_grid(path), out, command_fn=command, progress=False, env={"FAKE_LOG": str(log)})
        assert _tree(busy) == before  # no file deleted or written: no stdout.log, no error.txt
    assert res.failed == ["a/lag1/seed0"] and "424242" in res.records["a/lag1/seed0"].error
    assert res.names("finished") == ["a/lag1/seed1"] and res.exit_code == 1


def test_rerun_changed_moves_no_run_while_one_is_in_use(tmp_path, fake_trainer):
    """--rerun-changed moves the changed runs aside; one that a process trains in (by hand) stops it before any
    run moves."""
    command, _ = fake_trainer
    path, out = _grid(tmp_path, seeds=2), tmp_path / "out"
    assert run_grid_spec(load_grid(path), out, command_fn=command, progress=False).exit_code == 0
    before = _tree(out / "a")
    edited = load_grid(_grid(tmp_path, "{a: {sleep: 0.1}}", seeds=2))
    with open(out / "a/lag1/seed1" / LOCK, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("424242\n")
        held.flush()
        with pytest.raises(grid_mod.GridChangedError, match="satrl process 424242 is training in it; nothing was moved"):
            run_grid_spec(edited, out, command_fn=command, progress=False, rerun_changed=True)
        assert _tree(out / "a") == {**before, f"lag1/seed1/{LOCK}": b"424242\n"}
    assert not (out / ".replaced").exists() and not (out / "a/lag1/seed0" / LOCK).exists()


def test_a_fresh_start_leaves_a_folder_satrl_train_accepts(tmp_path):
    """A run without a checkpoint starts over: every file of the earlier attempt goes (satrl train refuses a
    folder holding any run file), the grid's stdout.log stays."""
    from satrl.config import load_config
    from satrl.rundir.files import _check_new

    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    (run / "checkpoints").mkdir()  # killed before its first checkpoint
    for name in ("config.yaml", "environment.json", "metrics.jsonl", "eval.jsonl", "summary.json", "tb/events"):
        (run / name).write_text("x\n")
    (run / "stdout.log").write_text("=== satrl grid earlier\n")
    grid_mod._prepare(run, False, ["satrl", "train"]).close()
    _check_new(run, load_config(None, []).model_dump(mode="json"))
    assert sorted(p.name for p in run.iterdir()) == ["stdout.log"]
    assert (run / "stdout.log").read_text().startswith("=== satrl grid earlier\n=== satrl grid ")


@pytest.mark.parametrize("cells, lags, field", [("{a: {}}", "[1, 1]", "lags"),
                                                ("{a: {lags: [2, 2]}}", "[1]", "cells.a.lags"),
                                                ("\n  a: {}\n  a: {train.lr: 1}", "[1]", "g.yaml:6: cells.a")])  # fmt: skip
def test_a_lag_or_cell_given_twice_is_refused(tmp_path, capsys, cells, lags, field):
    """`lags: [1, 1]` started two processes in one run folder; a cell given twice lost the first silently."""
    rc, err = _cli(capsys, str(_grid(tmp_path, cells, lags)), "--out", str(tmp_path / "out"))
    assert rc == 2 and len(err) == 1 and f"{field}: " in err[0] and "twice" in err[0], err
    assert not (tmp_path / "out").exists()
