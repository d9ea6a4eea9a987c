"""End-to-end runs of the whole loop: every shipped config, determinism, staleness, async accounting, R3."""

import json
import math

import pytest

from run_helpers import REPO, read_jsonl, stable

GPU_ONLY = {"qwen3_gpu.yaml", "qwen3_8b.yaml"}  # a real checkpoint, vLLM and CUDA: checked in tests/test_config.py instead
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name not in GPU_ONLY)
SUMMARY_KEYS = {"best_avg_at_k", "final_avg_at_k", "collapse_step", "d_pi_last25", "steps", "wall_time_s"}


@pytest.mark.parametrize("config", CONFIGS)
def test_every_shipped_config_runs(run_tiny, config):
    out = run_tiny("steps=2", "lag.n=2", config=config)
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["skipped"] == 0 for r in rows)
    assert all(math.isfinite(r["mismatch/d_pi"]) for r in rows)
    assert (out / "config.yaml").exists() and (out / "eval.jsonl").exists()


def test_concurrent_equals_sequential(run_tiny):
    args = ("steps=8", "lag.schedule=broadcast", "lag.n=4", "objective.name=sat_grpo", "seed=5")
    seq = run_tiny(*args, "backend=sequential", name="seq")
    conc = run_tiny(*args, "backend=local", name="conc")
    a, b = read_jsonl(seq / "metrics.jsonl"), read_jsonl(conc / "metrics.jsonl")
    assert len(a) == 8 and stable(a) == stable(b)
    assert read_jsonl(seq / "eval.jsonl") == read_jsonl(conc / "eval.jsonl")


@pytest.mark.parametrize("schedule, n, bound", [("broadcast", 3, 2 * 2 + 3 - 2), ("fixed", 5, 5 + 2 - 1), ("sync", 0, 1)])
def test_trained_lag_respects_schedule(run_tiny, schedule, n, bound):
    out = run_tiny("steps=10", f"lag.schedule={schedule}", f"lag.n={n}", "diagnostics.decompose=true")
    rows = read_jsonl(out / "metrics.jsonl")
    assert max(r["lag/max"] for r in rows) <= bound
    if schedule == "fixed":  # after warm-up every batch starts at lag exactly n
        assert any(r["lag/max"] == n + 1 for r in rows)
    # policy lag shows up in the decomposition exactly when there is lag
    for r in rows:
        assert (r["mismatch/d_policy"] > 0) == (r["lag/max"] > 0)


def test_async_drops_stale_samples_and_trains_none_twice(run_tiny, trained_ids):
    seen = trained_ids
    out = run_tiny("steps=16", "lag.schedule=async", "lag.max_staleness=3", "train.prompts_per_batch=6")
    rows = read_jsonl(out / "metrics.jsonl")
    dropped = sum(r["async/dropped"] for r in rows)
    assert len(seen) == len(set(seen)), "a sample was trained twice"
    assert dropped > 0 and len(seen) + dropped == 8 * 6 * 4  # 8 batches x 6 prompts x 4 samples, all accounted
    assert max(r["lag/max"] for r in rows) <= 3


def test_r3_removes_routing_disagreement(run_tiny):
    common = ("steps=2", "model.name=tiny-arith-moe", "engine.numerics=bf16", "train.prompts_per_batch=8")
    without = read_jsonl(run_tiny(*common, "r3=false", name="no_r3") / "metrics.jsonl")
    with_r3 = read_jsonl(run_tiny(*common, "r3=true", name="r3") / "metrics.jsonl")
    assert sum(r["moe/route_disagree"] for r in without) > 0
    assert all(r["moe/route_disagree"] == 0 for r in with_r3)


def test_metrics_reach_tensorboard_when_installed(run_tiny, monkeypatch):
    from satrl.rundir import files as rundir

    class FakeWriter:
        def __init__(self):
            self.scalars, self.closed = [], False

        def add_scalar(self, key, value, step):
            self.scalars.append((key, step))

        def close(self):
            self.closed = True

    writer = FakeWriter()
    monkeypatch.setattr(rundir, "_tensorboard", lambda path: writer)
    run_tiny("steps=2")
    assert ("mismatch/d_pi", 1) in writer.scalars and ("eval/avg_at_k", 2) in writer.scalars and writer.closed


def test_engine_process_start_failure_is_reported_with_its_cause():
    """An engine that cannot start in the local backend's child process (here: an unknown task) surfaces the
    child's own error in the trainer process, not just an exit code. A bad-input error (TaskError) comes back
    as itself, so the command line can print it as one line."""
    from satrl.pipeline.engines_host.local_backends import ProcessBackend
    from satrl.pipeline.engines_host.worker import RolloutRequest, WorkerSpec
    from satrl.tasks import TaskError

    backend = ProcessBackend(WorkerSpec(model="tiny-arith", task="no-such-task"), timeout_s=120)
    try:
        backend.submit(RolloutRequest(b=0, versions=[0]))
        with pytest.raises(TaskError, match=r"unknown task 'no-such-task'"):
            backend.result(0)
    finally:
        backend.close()
    assert not backend.proc.is_alive()


def test_weights_are_copied_to_cpu_at_most_once_per_version(run_tiny, monkeypatch):
    """Pushing weights, evaluating and checkpointing at every step all read one CPU copy per version."""
    from satrl.training import placement

    copies: list[int] = []
    original = placement.cpu_copy
    monkeypatch.setattr(placement, "cpu_copy", lambda model: copies.append(1) or original(model))
    out = run_tiny("steps=6", "lag.schedule=broadcast", "lag.n=1", "eval.every=1", "checkpoint.every=1",
                   "diagnostics.decompose=true")  # fmt: skip
    assert len(read_jsonl(out / "eval.jsonl")) >= 6 and (out / "checkpoints").is_dir()
    assert 0 < len(copies) <= 6 + 1  # versions 0..6; without the cache it is about 3 per step
