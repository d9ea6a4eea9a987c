"""Grid faults: SIGKILL `satrl grid` mid-way and rerun it (finished runs are not redone, the killed one
completes, no orphan keeps writing); a corrupt summary.json is reported and the run is done again.

The grid's runs are `python -m satrl train` processes, as the product starts them. The grid itself needs a
process of its own only where it is SIGKILLed; the two reruns are the command called in this process
(`satrl.cli.main`), sparing each a fresh interpreter's imports."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from run_helpers import REPO, read_jsonl
from satrl import cli

ENV = {"PYTHONPATH": str(REPO / "src"), "COLUMNS": "400"}  # the grid's children run this checkout's code


def _grid(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "grids" / "ci_smoke.yaml").read_text())
    spec["cells"] = {"grpo": {"base": str(REPO / "configs" / "grpo.yaml"), "label": "GRPO"}}
    spec["steps"], spec["extra"]["eval.every"] = 6, 0
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run_grid(grid, out, capfd):
    """``satrl grid GRID --out OUT`` in this process: its ``returncode``, ``stdout`` and ``stderr``."""
    capfd.readouterr()
    rc = cli.main(["grid", str(grid), "--out", str(out)])
    said = capfd.readouterr()
    return SimpleNamespace(returncode=rc, stdout=said.out, stderr=said.err)


@pytest.fixture
def env(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)


def _starts(run_dir):
    return (run_dir / "stdout.log").read_text().count("=== satrl grid")


def test_sigkill_grid_then_rerun(tmp_path, capfd, env):
    grid, out = _grid(tmp_path), tmp_path / "out"
    first, second = out / "grpo" / "lag2" / "seed0", out / "grpo" / "lag2" / "seed1"
    _killed_grid(grid, out, second)
    assert not (second / "summary.json").exists()
    done = (first / "summary.json").read_text()

    r = _run_grid(grid, out, capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (first / "summary.json").read_text() == done and _starts(first) == 1, "a finished run was redone"
    assert json.loads((second / "summary.json").read_text())["status"] == "finished"
    assert [row["step"] for row in read_jsonl(second / "metrics.jsonl")] == list(range(1, 7))

    (first / "summary.json").write_text('{"best_avg_at_k": 0.1, "sta')  # torn
    r = _run_grid(grid, out, capfd)
    assert r.returncode == 0, r.stdout[-2000:]
    said = r.stdout + r.stderr
    assert "invalid summary.json" in said and str(first) in said, said
    assert json.loads((first / "summary.json").read_text())["status"] == "finished"
    assert _starts(first) == 2 and _starts(second) == 2


def _killed_grid(grid, out, second):
    """``satrl grid`` in a process of its own, SIGKILLed once ``second``'s run has logged 2 steps; then no
    orphaned run may keep writing."""
    proc = subprocess.Popen([sys.executable, "-m", "satrl", "grid", str(grid), "--out", str(out)],
                            env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (second / "metrics.jsonl").exists() and len(read_jsonl(second / "metrics.jsonl")) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the grid finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(2.0)
    n = len((second / "metrics.jsonl").read_text())
    time.sleep(2.0)
    assert len((second / "metrics.jsonl").read_text()) == n, "an orphaned run kept writing after the grid died"
