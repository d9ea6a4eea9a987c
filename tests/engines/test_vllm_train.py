"""`satrl train` end to end on the vLLM engine: every backend and weight transport equal to the sequential run,
and no vLLM process outliving a run. Minutes (a vLLM start per run); its own file, so that `make test-vllm`'s
processes take it apart from the other vLLM files (pytest-xdist, whole files to one process)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import uuid

import pytest
from vllm_helpers import REQUIRED, needs_vllm, vllm_pids

from run_helpers import REPO, TINY, read_jsonl, stable

pytestmark = pytest.mark.vllm


@needs_vllm
@pytest.mark.slow
def test_satrl_train_with_the_vllm_engine(tmp_path):
    """`satrl train ... engine=vllm`: rollouts and the final evaluation through vLLM, with weight sync at lag 2;
    the local backend (engine in a child process, vLLM's own processes below it), the local backend with
    weights.transport=vllm (each version broadcast once and loaded by vLLM's weight-transfer API) and the Ray
    backend (vLLM inside a Ray actor; `make test-vllm` installs Ray) give the same metrics as the sequential one,
    bit for bit, and no vLLM process outlives a run.
    The evaluation engine lives in the driver process whatever the backend, and evaluation is not part of the
    metrics compared: the sequential run evaluates through vLLM (a second vLLM beside the rollout one in one
    process), the others through the torch engine, a vLLM start less each (vLLM's evaluation beside a local
    backend's vLLM child: test_vllm_runs.py)."""
    tag = uuid.uuid4().hex  # this test's vLLM processes (vllm_pids), whatever else runs beside it
    env = {**os.environ, "SATRL_TEST_TAG": tag}
    runs = {}
    backends = ("sequential", "local", "ray") if (REQUIRED or importlib.util.find_spec("ray")) else ("sequential", "local")
    backends += ("local-vllm-transport",)  # vLLM's own weight-transfer API (weights.transport=vllm)
    for backend in backends:
        out = tmp_path / backend
        name, _, transport = backend.partition("-")
        extra = ["weights.transport=vllm"] if transport else []
        extra += [] if backend == "sequential" else ["eval.engine=torch"]
        args = [sys.executable, "-m", "satrl", "train", str(REPO / "configs" / "sat_grpo.yaml"), *TINY,
                "engine=vllm", "steps=4", "lag.n=2", f"backend={name}", *extra, f"out={out}"]  # fmt: skip
        r = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, r.stderr[-4000:]
        runs[backend] = rows = read_jsonl(out / "metrics.jsonl")
        assert [row["step"] for row in rows] == [1, 2, 3, 4]
        assert max(row["lag/max"] for row in rows) >= 1  # batch 2 came after a weight sync
        # step 1 is at lag 0: d is pure implementation mismatch (bf16-weights engine vs fp32 trainer): small, real
        assert 0 < rows[0]["mismatch/d_pi"] < 0.02 and all(math.isfinite(row["loss"]) for row in rows)
        print(f"backend={backend}: d_pi at lag 0 (step 1) = {rows[0]['mismatch/d_pi']:.2e}")
        assert json.loads((out / "summary.json").read_text())["steps"] == 4 and (out / "eval.jsonl").read_text().strip()
        assert "name: vllm" in (out / "config.yaml").read_text()
    assert all(stable(runs[b]) == stable(runs["sequential"]) for b in backends)
    for _ in range(20):  # vLLM's processes stop within seconds of the run's end
        if not vllm_pids(tag):
            break
        time.sleep(0.5)
    assert not vllm_pids(tag), "vLLM processes outlived the run"
