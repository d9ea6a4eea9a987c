"""`satrl train` end to end on the vLLM engine: every backend and weight transport equal to the sequential run,
and no vLLM process outliving a run; `satrl eval` on vLLM. Minutes (a vLLM start per run). The vLLM runs are split
over this file and test_vllm_runs.py so that `make test-vllm`'s two processes (pytest-xdist, whole files to one
process) take about as long each; the sequential run both compare with is made once (``shared_train``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from vllm_helpers import REQUIRED, VLLM_TRAIN, check_vllm_run, needs_vllm, vllm_pids

from run_helpers import stable

pytestmark = pytest.mark.vllm


@needs_vllm
@pytest.mark.slow
def test_satrl_train_with_the_vllm_engine(tmp_path, shared_train):
    """`satrl train ... engine=vllm`: rollouts and the final evaluation through vLLM, with weight sync at lag 2;
    the local backend (engine in a child process, vLLM's own processes below it) and the Ray backend (vLLM inside a
    Ray actor; `make test-vllm` installs Ray) give the same metrics as the sequential one, bit for bit, and no vLLM
    process outlives a run (the local backend with weights.transport=vllm: test_vllm_runs.py).
    The evaluation engine lives in the driver process whatever the backend, and evaluation is not part of the
    metrics compared: the sequential run evaluates through vLLM (a second vLLM beside the rollout one in one
    process), the others through the torch engine, a vLLM start less each (vLLM's evaluation beside a local
    backend's vLLM child: test_vllm_runs.py)."""
    tag = uuid.uuid4().hex  # this test's vLLM processes (vllm_pids), whatever else runs beside it
    env = {**os.environ, "SATRL_TEST_TAG": tag}
    sequential = check_vllm_run(shared_train(*VLLM_TRAIN, "backend=sequential"))
    backends = ("local", "ray") if (REQUIRED or importlib.util.find_spec("ray")) else ("local",)
    for backend in backends:
        out = tmp_path / backend
        args = [sys.executable, "-m", "satrl", "train", *VLLM_TRAIN, f"backend={backend}", "eval.engine=torch",
                f"out={out}"]  # fmt: skip
        r = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, r.stderr[-4000:]
        assert stable(check_vllm_run(out)) == stable(sequential), backend
    for _ in range(20):  # vLLM's processes stop within seconds of the run's end
        if not vllm_pids(tag):
            break
        time.sleep(0.5)
    assert not vllm_pids(tag), "vLLM processes outlived the run"


@needs_vllm
@pytest.mark.slow
def test_satrl_eval_with_the_vllm_engine_matches_torch_greedy():
    """`satrl eval --engine vllm`: greedy accuracy equals the torch engine's (fp32 both: same argmax)."""
    out = {}
    for engine in ("torch", "vllm"):
        args = [sys.executable, "-m", "satrl", "eval", "--model", "tiny-arith", "--engine", engine, "--k", "2",
                "--n-problems", "40", "--max-new-tokens", "6", "--json"]  # fmt: skip
        r = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        out[engine] = json.loads(next(x for x in r.stdout.splitlines()[::-1] if x.startswith('{"')))
    assert out["vllm"]["greedy_acc"] == out["torch"]["greedy_acc"] > 0.3
    assert 0.1 < out["vllm"]["avg_at_k"] < 0.9 and out["vllm"]["n_problems"] == 40
