"""`satrl train` on the vLLM engine with in-flight updates, and with vLLM's own weight transfer, end to end
(minutes; the vLLM runs are split over this file and test_vllm_train.py, which says why)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from vllm_helpers import VLLM_TRAIN, check_vllm_run, needs_vllm, vllm_pids

from run_helpers import REPO, TINY, read_jsonl, stable

pytestmark = pytest.mark.vllm


@needs_vllm
@pytest.mark.slow
def test_satrl_train_inflight_on_vllm_local_equals_sequential(tmp_path):
    """`engine=vllm lag.inflight_every=2`: responses cross versions, and the local backend (the engine process
    waiting mid-rollout for versions) equals its sequential replay, metric for metric. The local run evaluates
    through vLLM (a vLLM in the driver beside the engine process's own); the sequential one through the torch
    engine, a vLLM start less (evaluation is not among the metrics compared; the sequential backend's vLLM
    evaluation: test_vllm_train.py)."""
    runs = {}
    for backend in ("sequential", "local"):
        out = tmp_path / backend
        evals = ["eval.engine=torch"] if backend == "sequential" else []
        args = [sys.executable, "-m", "satrl", "train", str(REPO / "configs" / "sat_grpo.yaml"), *TINY, "engine=vllm",
                "engine.max_new_tokens=7", "lag.inflight_every=2", "steps=4", "lag.n=1", f"backend={backend}", *evals,
                f"out={out}"]  # fmt: skip
        r = subprocess.run(args, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-4000:]
        runs[backend] = read_jsonl(out / "metrics.jsonl")
    assert read_jsonl(tmp_path / "local" / "eval.jsonl")  # the final evaluation, through vLLM
    assert max(row["lag/multi_version_frac"] for row in runs["local"]) > 0
    assert stable(runs["local"]) == stable(runs["sequential"])


@needs_vllm
@pytest.mark.slow
def test_satrl_train_with_vllm_weight_transfer_equals_sequential(tmp_path, shared_train):
    """The local backend with weights.transport=vllm (each version broadcast once and loaded by vLLM's
    weight-transfer API) gives the sequential run's metrics bit for bit (the run test_vllm_train.py compares its
    backends with, made once), and no vLLM process outlives it. After the in-flight test in this file, so that the
    other xdist process has made the sequential run by then."""
    tag = uuid.uuid4().hex
    out = tmp_path / "local-vllm-transport"
    args = [sys.executable, "-m", "satrl", "train", *VLLM_TRAIN, "backend=local", "weights.transport=vllm",
            "eval.engine=torch", f"out={out}"]  # fmt: skip
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "SATRL_TEST_TAG": tag})
    assert r.returncode == 0, r.stderr[-4000:]
    sequential = check_vllm_run(shared_train(*VLLM_TRAIN, "backend=sequential"))
    assert stable(check_vllm_run(out)) == stable(sequential)
    for _ in range(20):  # vLLM's processes stop within seconds of the run's end
        if not vllm_pids(tag):
            break
        time.sleep(0.5)
    assert not vllm_pids(tag), "vLLM processes outlived the run"
