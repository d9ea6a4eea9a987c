"""Weights travel once per version; requests name versions only (issue 28, step 2's inproc groundwork)."""

import pickle

import pytest
import torch

from run_helpers import TINY, read_jsonl, stable
from satrl.config import load_config
from satrl.pipeline import orchestrator
from satrl.pipeline.rollouts import horizon
from satrl.pipeline.schedules import make_schedule
from satrl.pipeline.weights import payload_weights
from satrl.pipeline.worker import RolloutRequest, RolloutWorker, WeightsMissing, WorkerSpec

ARGS = ["steps=8", "lag.schedule=broadcast", "lag.n=3", "seed=2"]


def _spy(monkeypatch):
    """Every backend the loop makes, and every request and weight push it gets."""
    made, requests, pushes = [], [], []
    make = orchestrator.make_backend

    def spy(name, spec, **options):
        backend = make(name, spec, **options)
        submit, push = backend.submit, backend.push
        backend.submit = lambda req: requests.append(req) or submit(req)
        backend.push = lambda v, state: pushes.append(v) or push(v, state)
        made.append(backend)
        return backend

    monkeypatch.setattr(orchestrator, "make_backend", spy)
    return made, requests, pushes


def test_payload_weights_finds_tensors():
    assert payload_weights({"a": [1, (2, torch.zeros(1))]})
    assert not payload_weights(RolloutRequest(3, [0, 1]))


def test_requests_carry_no_weights_and_each_version_is_pushed_once(tmp_path, monkeypatch):
    made, requests, pushes = _spy(monkeypatch)
    held = []
    cfg = load_config(None, [*TINY, *ARGS, f"out={tmp_path / 'run'}"])
    orchestrator.train(cfg, on_step=lambda *_: held.append(set(made[0].worker.weights)))
    assert requests and not any(payload_weights(r) for r in requests)
    assert max(len(pickle.dumps(r)) for r in requests) < 1000  # versions only, whatever the model's size
    assert len(pushes) == len(set(pushes)), f"a version was pushed twice: {pushes}"
    sched = make_schedule("broadcast", cfg.steps_per_batch, 3)
    assert set(pushes) == {sched.version(r.b, 0) for r in requests}  # exactly the versions some batch needs
    assert max(len(h) for h in held) <= horizon(sched) + 1  # the engine side forgets what no batch needs
    assert held[-1] <= set(pushes)


def test_local_backend_equals_sequential(tmp_path):
    runs = {}
    for backend in ("sequential", "local"):
        out = tmp_path / backend
        orchestrator.train(load_config(None, [*TINY, *ARGS, f"backend={backend}", f"out={out}"]))
        runs[backend] = stable(read_jsonl(out / "metrics.jsonl"))
    assert runs["local"] == runs["sequential"]


def test_a_version_the_engine_does_not_hold_is_a_clear_error():
    worker = RolloutWorker(WorkerSpec(model="tiny-arith", task="arithmetic", prompts_per_batch=2, group_size=2))
    worker.put(0, {})
    worker.keep({0})
    with pytest.raises(WeightsMissing, match=r"batch 1 is generated with version 4, whose weights the engine does not hold"):
        worker.rollout(RolloutRequest(1, [4, 4]))
    worker.close()
