"""The rollout worker: task prompts in, scored :class:`~satrl.types.Sample` groups out.

A worker owns an engine, a tokenizer and the task's train stream. It is built from a picklable
:class:`WorkerSpec`, so the same object runs in-process (sequential backend), in a child process (local
backend), or as a Ray actor, without the orchestration loop changing.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from satrl import faults
from satrl.engines.numerics import DEFAULT_NUMERICS
from satrl.models.chat import PLAIN, ChatFormat, encode_prompt
from satrl.pipeline.schedules import inflight_version
from satrl.types import (
    Closable,
    GenerationRequest,
    Problem,
    Sample,
    SamplingParams,
    Score,
    ScoringTask,
    Switch,
    TransferEngine,
    request_seed,
)
from satrl.weights.link import Inbox, Link
from satrl.weights.messages import Keep, Load, Put, Take, WeightMessage


@dataclass(frozen=True)
class WorkerSpec:
    """Plain arguments to build a worker anywhere (the config is turned into these at the edge)."""

    model: str
    task: str
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    engine: str = "torch"
    numerics: str = DEFAULT_NUMERICS
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    capture_routing: bool | None = None  # True when R3 needs it: an engine that cannot capture then refuses
    threads: int = 1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompts_per_batch: int = 16
    group_size: int = 8
    seed: int = 0
    chat: ChatFormat = PLAIN  # how prompts become token ids (model.chat)


@dataclass
class RolloutRequest:
    """Generate batch ``b``; group ``g`` starting with the weights of version ``versions[g]``. A request names
    versions only: the weights reach the worker once per version (:meth:`RolloutWorker.receive`, :mod:`satrl.weights`),
    under in-flight updates possibly after the request (the worker then waits for them, :attr:`RolloutWorker.wait`)."""

    b: int
    versions: list[int]
    # In-flight updates (``lag.inflight_every``): every this many decoded tokens a group moves one version on,
    # up to ``cap`` (schedules.inflight_version). 0: each group keeps its version to the end.
    inflight_every: int = 0
    cap: int = 0


@dataclass(frozen=True)
class RolloutResult:
    """What a rollout hands back on every backend: the samples of batch ``b`` (of a Ray actor's shard of it), and
    the seconds the engine spent on them, which the backend sums into ``perf/engine_busy_s``."""

    b: int
    samples: list[Sample]
    busy_s: float


IN_ENGINE = "in the engine"  # what the worker holds of a version the engine loaded through its own API (vllm)


class WeightsMissing(RuntimeError):
    """A batch needs a version the engine side does not hold: a bug in who pushes or forgets weights, never
    something to paper over by generating with other weights."""


class RolloutWorker:
    """Generates and scores batches with the versions it holds.

    ``wait`` takes the next weight-sync message off the engine side's queue (the ``local`` backend's engine
    process passes it): how an in-flight rollout (``lag.inflight_every``) waits for a version the trainer has not
    made yet. None: every version a rollout needs is held before it starts (``sequential``, ``ray``), so a missing
    one is :class:`WeightsMissing` at once instead of a wait that nothing would end.
    """

    def __init__(self, spec: WorkerSpec, wait: Callable[[], None] | None = None, inbox: Inbox | None = None) -> None:
        from satrl.engines.registry import engine_for
        from satrl.models import load_tokenizer
        from satrl.tasks import make_task

        self.spec = spec
        self.tokenizer = load_tokenizer(spec.model)
        self.engine = engine_for(
            spec.engine,
            self.tokenizer,
            model_path=spec.model,
            numerics=spec.numerics,
            capture_routing=spec.capture_routing,
            **spec.engine_kwargs,
        )
        with warnings.catch_warnings():  # the main process built the task first and warned of its skipped rows
            warnings.simplefilter("ignore", UserWarning)
            self.task = make_task(spec.task, **spec.task_kwargs)
        self._stream = self.task.problems("train", spec.seed)
        self._cursor = 0  # index of the next batch the stream will serve
        # version -> its weights as the transport delivered them: a state dict, a ref into Ray's object store (ray),
        # or IN_ENGINE (vllm: the engine loaded it itself)
        self.weights: dict[int, Any] = {}
        self.wait = wait
        self.inbox = inbox  # dist: where the trainer's broadcasts arrive, on a thread of their own

    def receive(self, message: WeightMessage) -> None:
        """The engine side of every transport: what happens to a version once its message comes off the queue (in
        queue order, so before the first request that needs it)."""
        match message:
            case Put(version, weights):  # inproc: the message carries the state dict (ray: its object-store ref)
                self.weights[version] = weights
            case Take(version):  # dist: the version was broadcast; its buckets arrived on the inbox's thread
                self.weights[version] = self.inbox.take(version)
            case Load(version):  # vllm: the engine loads it through its own API, and then holds that one only
                self._transfer_engine().receive_weights(version)
                self.weights = {version: IN_ENGINE}  # a batch that still needs the one before is WeightsMissing
            case Keep(versions):  # no pending batch is generated with any other version
                self.weights = {v: w for v, w in self.weights.items() if v in versions}
            case _:
                raise TypeError(f"the rollout worker takes no {type(message).__name__} messages")

    def held(self) -> list[int]:
        """The versions this worker can generate with, in order."""
        return sorted(self.weights)

    def open_transfer(self, link: Link) -> None:
        """``weights.transport=vllm``: the engine's own workers join the trainer's group."""
        self._transfer_engine().open_transfer(link.port, link.prefix, link.host)

    def _transfer_engine(self) -> TransferEngine:
        if not isinstance(self.engine, TransferEngine):
            raise TypeError(f"weights.transport=vllm needs an engine with its own weight transfer; "
                            f"{type(self.engine).__name__} has none")  # fmt: skip
        return self.engine

    def close(self) -> None:
        """Stop the engine's own processes, if it has any (vLLM); a no-op for the torch engine."""
        if isinstance(self.engine, Closable):
            self.engine.close()

    def _problems(self, b: int) -> list[Problem]:
        P = self.spec.prompts_per_batch
        if b < self._cursor:  # restart the stream (resume after a crash, or a replayed batch)
            self._stream, self._cursor = self.task.problems("train", self.spec.seed), 0
        skip = (b - self._cursor) * P
        problems = list(itertools.islice(self._stream, skip, skip + P))
        if len(problems) < P:
            raise RuntimeError(f"task {self.spec.task!r} ran out of train problems at batch {b}")
        self._cursor = b + 1
        return problems

    def rollout(self, req: RolloutRequest, groups: list[int] | None = None) -> list[Sample]:
        """Generate and score the G samples of each prompt group of batch ``req.b``, sorted by sample id.

        The one rollout body of every backend. ``groups``: only these prompt groups (a Ray actor's shard;
        default all). The worker still reads the whole batch's problems from its stream, since group g's
        prompt is the g-th problem of batch b. A held version is loaded (:meth:`_use`: Ray fetches it from the object
        store then) only when the engine is not on it yet.
        """
        faults.point("worker.rollout")
        problems = self._problems(req.b)
        groups = list(range(len(req.versions))) if groups is None else groups
        out: list[Sample] = []
        threads = torch.get_num_threads()
        torch.set_num_threads(self.spec.threads)  # fixed thread count: bitwise-stable numerics
        try:
            for version in sorted({req.versions[g] for g in groups}):
                self._use(req.b, version)
                switch = self._switch(req, version) if req.inflight_every > 0 else None
                out += self._generate(req.b, [g for g in groups if req.versions[g] == version], problems, switch)
        finally:
            torch.set_num_threads(threads)
        return sorted(out, key=lambda s: s.id)

    def timed_rollout(self, req: RolloutRequest, groups: list[int] | None = None) -> RolloutResult:
        """:meth:`rollout` with the seconds it took: what every backend's engine side returns."""
        t0 = time.perf_counter()
        samples = self.rollout(req, groups)
        return RolloutResult(req.b, samples, time.perf_counter() - t0)

    def _use(self, b: int, version: int, wait: bool = False) -> None:
        """Put the engine on ``version`` (a no-op if it is on it already): load the held weights into it (Ray
        fetches them from its object store only now, so an actor whose engine is on it never copies them)."""
        if self.engine.version == version:
            return
        faults.point("engine.load_weights")
        held = self._held(b, version, wait)
        if self.engine.version == version:  # vllm: the engine loaded it itself while the rollout waited
            return
        if held is IN_ENGINE:  # it loaded a later one since: that forgot this one
            raise RuntimeError(f"the engine is on version {self.engine.version}, not {version}, which it loaded itself")
        state = held if isinstance(held, dict) else _from_object_store(held)
        self.engine.load_weights(state, version)

    def _switch(self, req: RolloutRequest, start: int) -> Switch:
        """The engine's hook for in-flight updates: before decode step t, the version the schedule fixes for it
        (waiting for the trainer to make it, on the local backend)."""
        def use(t: int) -> None:
            self._use(req.b, inflight_version(start, req.cap, req.inflight_every, t), wait=True)

        return Switch(req.inflight_every, use)

    def _held(self, b: int, version: int, wait: bool = False) -> Any:
        while wait and self.wait is not None and version not in self.weights:
            self.wait()  # in flight: the trainer pushes this version once it has made it
        if version in self.weights:
            return self.weights[version]
        raise WeightsMissing(f"batch {b} is generated with version {version}, whose weights the engine does not "
                             f"hold (it holds {self.held()}, and its engine is on {self.engine.version})")  # fmt: skip

    def _generate(self, b: int, groups: list[int], problems: list[Problem], switch=None) -> list[Sample]:
        G, seed = self.spec.group_size, self.spec.seed
        requests, meta = [], []
        for g in groups:
            prompt_ids = encode_prompt(self.tokenizer, problems[g].prompt, self.spec.chat)
            for i in range(G):
                rid = f"b{b:06d}-g{g:04d}-i{i:03d}"
                requests.append(GenerationRequest(rid, list(prompt_ids), request_seed("rollout", seed, b, g, i)))
                meta.append((g, problems[g]))
        completions = self.engine.generate(requests, self.spec.sampling, switch=switch)
        out = []
        for c, (g, problem) in zip(completions, meta):
            score = self._score(problem, c.text)
            out.append(Sample(
                id=c.request_id,
                group_id=f"b{b:06d}-g{g:04d}",
                prompt_ids=c.prompt_ids,
                response_ids=c.response_ids,
                behavior_logp=c.behavior_logp,
                version=c.version,
                reward=score.reward,
                routing=c.routing,
                meta={"reward_timeout": True} if score.timed_out else {},
                token_versions=c.token_versions,
            ))  # fmt: skip
        return out

    def _score(self, problem: Problem, text: str) -> Score:
        """The task's grade; only a :class:`~satrl.types.ScoringTask` can report a grading timeout."""
        if isinstance(self.task, ScoringTask):
            return self.task.score(problem, text)
        return Score(float(self.task.reward(problem, text)))


def _from_object_store(ref: Any) -> dict[str, torch.Tensor]:
    """A version's state dict fetched from Ray's object store (ray is an optional extra: imported only here)."""
    import ray

    return ray.get(ref)
