"""SIGKILL a run at a random step, resume it, and get exactly the metrics of an uninterrupted run."""

import os
import random
import signal
import subprocess
import sys
import time

from run_helpers import REPO, TINY, read_jsonl, stable
from satrl.provenance import read_sessions


def test_resume_after_sigkill_equals_uninterrupted(run_tiny, tmp_path):
    args = ["steps=12", "lag.schedule=broadcast", "lag.n=3", "objective.name=sat_grpo", "seed=11", "eval.every=4"]
    reference = run_tiny(*args, name="reference")

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "satrl", "train", *TINY, *args, f"out={out}", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}  # this checkout's code, not an installed copy
    kill_after = random.Random(os.getpid()).randint(2, 9)  # a random step, logged so a failure can be replayed
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    logged = len((out / "metrics.jsonl").read_text().splitlines())  # the run may pass kill_after before the kill lands

    resumed = subprocess.run(
        [sys.executable, "-m", "satrl", "train", "--resume", str(out), "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert resumed.returncode == 0, f"kill_after={kill_after}: {resumed.stderr[-2000:]}"
    a, b = read_jsonl(reference / "metrics.jsonl"), read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, 13)), f"kill_after={kill_after}"
    assert stable(a) == stable(b), f"kill_after={kill_after}"
    assert read_jsonl(reference / "eval.jsonl") == read_jsonl(out / "eval.jsonl")
    # environment.json: one entry per session, the resumed one from its checkpoint's step (or a fresh start)
    sessions = read_sessions(out)
    assert sessions[0]["from_step"] == 0 and all(s["cpu"]["capability"] for s in sessions)
    assert len(sessions) == 1 + (sessions[-1]["from_step"] > 0) and sessions[-1]["from_step"] <= logged
    assert [s["from_step"] for s in read_sessions(reference)] == [0]
