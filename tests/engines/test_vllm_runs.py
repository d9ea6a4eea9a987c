"""`satrl train` with in-flight updates and `satrl eval` on the vLLM engine, end to end (minutes; a file of its
own for the same reason as test_vllm_train.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm_helpers import needs_vllm

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
