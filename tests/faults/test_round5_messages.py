"""Issue 60, unclear messages made clear: a leaderboard whose results folder holds no runs ("cannot reindex on an
axis with duplicate labels" before), an export into a symlink to an empty folder ("Not a directory"), and the
data-parallel rank watchdog's resume line, which printed a literal ``RUN_DIR``."""

import os
import subprocess
import sys
import threading

import pytest
import yaml

from run_helpers import REPO
from satrl.cli import main
from satrl.experiments.store import load_runs
from satrl.launch import data_parallel
from satrl.training import dp


def _one_line(capsys, *argv) -> str:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, (rc, err)
    return err[0]


def test_no_runs_has_unique_columns(tmp_path):
    runs = load_runs(tmp_path)
    assert runs.empty and runs.columns.is_unique
    assert runs[runs["status"] == "finished"].empty  # the lookup that raised on the doubled "status" label


def test_leaderboard_on_a_folder_without_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    spec = tmp_path / "lb.yaml"
    spec.write_text(yaml.safe_dump({"title": "T", "description": "D", "methods": [{"cell": "half", "label": "H"}],
                                    "testbeds": [{"key": "a", "name": "A", "results": "empty", "trial": "t",
                                                  "base": "grpo", "lag": 8, "reference_lag": 0}]}))  # fmt: skip
    line = _one_line(capsys, "leaderboard", spec, "--out", tmp_path / "o", "--resamples", "10")
    assert "testbeds.0.results: empty holds no grid runs" in line and "reindex" not in line, line


def test_export_into_a_link_to_an_empty_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to("empty")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("seed: 0\n")
    line = _one_line(capsys, "export", tmp_path / "run", tmp_path / "link")
    assert f"{tmp_path / 'link'}: a symbolic link (to empty)" in line and str(tmp_path / "empty") in line, (
        line
    )
    assert "Not a directory" not in line


def test_a_gone_launcher_names_the_run_to_resume():
    code = ("import threading; from satrl.training.dp import watch_launcher; "
            f"watch_launcher({os.getppid()}, threading.Event(), 0.05, 'runs/dp-run')")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "RANK": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "--resume runs/dp-run under torchrun" in done.stderr, done.stderr
    assert "RUN_DIR" not in done.stderr


def test_the_data_parallel_run_passes_its_folder_to_the_watchdog(tiny_cfg, monkeypatch):
    cfg = tiny_cfg(name="dp-run")
    seen = {}

    def init(device, rank_timeout_s, run_dir=None):
        seen["run_dir"] = run_dir
        raise RuntimeError("stop here")

    monkeypatch.setattr(dp, "init", init)
    with pytest.raises(RuntimeError, match="stop here"):
        data_parallel.run(cfg, lambda: None)
    assert str(seen["run_dir"]) == str(cfg.run_dir())
    assert "RUN_DIR" not in dp.resume_hint(cfg.run_dir()) and str(cfg.run_dir()) in dp.resume_hint(
        cfg.run_dir()
    )


def test_watchdog_line_names_the_run(capsys, monkeypatch):
    class Store:
        def set(self, *a):
            pass

        def check(self, keys):
            return False

    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    monkeypatch.setattr(threading, "Thread", lambda *a, **k: type("T", (), {"start": lambda self: None})())
    w = dp.Watchdog(Store(), 0, 2, 5.0, "runs/dp-run")
    with pytest.raises(SystemExit):
        w._hung(1)
    err = capsys.readouterr().err
    assert "--resume runs/dp-run under torchrun" in err and "RUN_DIR" not in err
