"""Grid faults: SIGKILL `satrl grid` mid-way and rerun it (finished runs are not redone, the killed one
completes, no orphan keeps writing); a corrupt summary.json is reported and the run is done again."""

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from run_helpers import REPO, read_jsonl

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "400"}


def _grid(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "grids" / "ci_smoke.yaml").read_text())
    spec["cells"] = {"grpo": {"base": str(REPO / "configs" / "grpo.yaml"), "label": "GRPO"}}
    spec["steps"], spec["extra"]["eval.every"] = 6, 0
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run_grid(grid, out, **kw):
    return subprocess.run([sys.executable, "-m", "satrl", "grid", str(grid), "--out", str(out)], env=ENV,
                          capture_output=True, text=True, timeout=600, **kw)  # fmt: skip


def _starts(run_dir):
    return (run_dir / "stdout.log").read_text().count("=== satrl grid")


def test_sigkill_grid_then_rerun(tmp_path):
    grid, out = _grid(tmp_path), tmp_path / "out"
    first, second = out / "grpo" / "lag2" / "seed0", out / "grpo" / "lag2" / "seed1"
    proc = subprocess.Popen([sys.executable, "-m", "satrl", "grid", str(grid), "--out", str(out)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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
    assert not (second / "summary.json").exists()
    done = (first / "summary.json").read_text()

    r = _run_grid(grid, out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (first / "summary.json").read_text() == done and _starts(first) == 1, "a finished run was redone"
    assert json.loads((second / "summary.json").read_text())["status"] == "finished"
    assert [row["step"] for row in read_jsonl(second / "metrics.jsonl")] == list(range(1, 7))

    (first / "summary.json").write_text('{"best_avg_at_k": 0.1, "sta')  # torn
    r = _run_grid(grid, out)
    assert r.returncode == 0, r.stdout[-2000:]
    said = r.stdout + r.stderr
    assert "invalid summary.json" in said and str(first) in said, said
    assert json.loads((first / "summary.json").read_text())["status"] == "finished"
    assert _starts(first) == 2 and _starts(second) == 2
