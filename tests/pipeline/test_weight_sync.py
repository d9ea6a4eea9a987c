"""Weights travel once per version; requests name versions only (issue 28, step 2's inproc groundwork)."""

import pickle

import pytest
import torch

from run_helpers import TINY, read_jsonl, stable
from satrl.config import load_config
from satrl.loop import orchestrator
from satrl.loop.rollouts import horizon
from satrl.pipeline.engines_host.worker import RolloutRequest, RolloutWorker, WeightsMissing, WorkerSpec
from satrl.pipeline.schedules import make_schedule
from satrl.weights.messages import Keep, Put
from satrl.weights.snapshot import Snapshot

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


def payload_weights(obj) -> bool:
    """Whether ``obj`` holds a tensor anywhere in its attributes (the check that requests carry no weights)."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(payload_weights(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(payload_weights(v) for v in obj)
    return hasattr(obj, "__dict__") and payload_weights(vars(obj))


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
    worker.receive(Put(0, {}))
    worker.receive(Keep((0,)))
    with pytest.raises(WeightsMissing, match=r"batch 1 is generated with version 4, whose weights the engine does not hold"):
        worker.rollout(RolloutRequest(1, [4, 4]))
    worker.close()


class _TransferEngine:
    """An engine with its own weight transfer (weights.transport=vllm's seam), on the torch engine's generation:
    it records what it was told and holds one version, the last it loaded."""

    def __init__(self, engine) -> None:
        self.inner, self.loaded, self.version = engine, [], engine.version

    def open_transfer(self, port: int, prefix: str, host: str = "127.0.0.1") -> None:
        self.link = (port, prefix, host)

    def receive_weights(self, version: int) -> None:
        self.loaded.append(version)
        self.version = version

    def load_weights(self, state, version):
        raise AssertionError("a transfer engine never loads weights through the pipeline")

    def generate(self, requests, sampling, switch=None):
        return self.inner.generate(requests, sampling, switch)


def test_an_engine_that_holds_one_version_moves_forward_and_refuses_to_go_back():
    from satrl.weights.link import Link
    from satrl.weights.messages import Load

    worker = RolloutWorker(WorkerSpec(model="tiny-arith", task="arithmetic", prompts_per_batch=2, group_size=2))
    worker.engine = engine = _TransferEngine(worker.engine)
    worker.open_transfer(Link(1234, "engine1/"))  # the engine's own workers join the trainer's group
    assert engine.link == (1234, "engine1/", "127.0.0.1")
    worker.receive(Load(0))
    worker.receive(Load(2))
    assert engine.loaded == [0, 2] and worker.held() == [2]  # version 0 left with the engine
    assert len(worker.rollout(RolloutRequest(0, [2, 2]))) == 4  # on version 2 already: nothing loaded
    with pytest.raises(WeightsMissing, match=r"version 0, whose weights the engine does not hold \(it holds \[2\]"):
        worker.rollout(RolloutRequest(1, [0, 0]))
    worker.engine = engine.inner
    with pytest.raises(TypeError, match="weights.transport=vllm needs an engine with its own weight transfer"):
        worker.receive(Load(3))
    worker.close()


def test_a_restarted_engine_gets_each_version_just_before_the_first_request_that_needs_it():
    """The refeed after a restart: an engine that holds one version at a time only moves forward, so versions and
    re-issued requests go out interleaved, in order."""
    from satrl.pipeline.engines_host.local_backends import ProcessBackend

    sent: list[tuple] = []
    backend = ProcessBackend.__new__(ProcessBackend)  # the refeed alone: no engine process
    backend._send, backend.link = sent.append, None  # inproc
    backend.held = {v: Snapshot.of_state({}) for v in (3, 5, 6, 9)}
    backend.in_flight = {11: RolloutRequest(11, [5, 5]), 10: RolloutRequest(10, [3, 5]), 12: RolloutRequest(12, [6, 6])}
    backend._refeed()
    from satrl.pipeline.engines_host.engine_process import Rollout

    assert [("weights", m.version) if isinstance(m, Put) else ("rollout", m.request.b) for m in sent] == [
        ("weights", 3), ("weights", 5), ("rollout", 10), ("rollout", 11), ("weights", 6), ("rollout", 12),
        ("weights", 9),
    ]  # fmt: skip
    assert all(isinstance(m, (Put, Rollout)) for m in sent)


def test_a_push_restarts_the_engine_deadline():
    """An in-flight rollout (lag.inflight_every) waits for the trainer's next version: a training step longer
    than engine.timeout_s must not read as an engine hang once the version arrives."""
    import time

    from satrl.pipeline.engines_host.local_backends import ProcessBackend

    backend = ProcessBackend.__new__(ProcessBackend)
    backend._send, backend.link, backend.held = (lambda message: None), None, {}  # inproc
    backend.timeout_s, backend._started = 5.0, True
    backend.in_flight = {4: RolloutRequest(4, [3, 3])}
    backend._since = time.monotonic() - 60  # the trainer trained for a minute since the last result
    assert backend._overdue()
    backend.push(4, Snapshot.of_state({}))
    assert not backend._overdue()
