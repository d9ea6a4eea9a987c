"""Ray backend: the rollout worker as Ray actors, sharing each batch's prompt groups (extra ``ray``).

The orchestration loop and the trainer stay in the driver process (``breakpoint()`` still works there); each
engine worker is a Ray actor wrapping the same :class:`~satrl.pipeline.engines_host.worker.RolloutWorker` the local
backends use, with the same rollout body (``RolloutWorker.rollout`` given the actor's groups). A batch's P
prompt groups are split into contiguous shards, one per actor, and the shards' samples are merged sorted by
sample id. Samples equal the local backend's because sampling depends only on
``request_seed("rollout", seed, b, g, i)`` and the weights, never on which process or batch generates a
request (the torch engine's rows do not depend on the other rows of the call;
``tests/pipeline/test_ray_backend.py`` checks the whole run bit for bit). Settings: the ``ray:`` config section.

Weights travel as ``inproc`` (``weights.transport``, the one this backend carries): :meth:`RayBackend.push` puts
each version's state dict into Ray's object store once, and each shard's call carries the
:class:`~satrl.weights.messages.Put` of every version it needs (a ref), which the actor's worker receives
(``RolloutWorker.receive``); an actor fetches a version only when its engine is not already on it, and forgets
the refs after the call. Requests themselves name versions only.

Fault tolerance: actors are created with ``max_restarts``; a shard whose actor died (crash, OOM kill,
``ray.kill(actor, no_restart=False)``) is re-issued to the restarted actor. A shard is merged at most once,
so no sample is lost or duplicated, and a re-issued shard yields the same samples (same seeds, same weights).
A hung actor (a batch not back within ``timeout_s``) is killed that way too, and its shards re-issued.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from satrl.pipeline.engines_host.worker import (
    RolloutRequest,
    RolloutResult,
    RolloutWorker,
    WeightsMissing,
    WorkerSpec,
)
from satrl.pipeline.errors import EngineError
from satrl.types import Sample
from satrl.weights.messages import Keep, Put
from satrl.weights.snapshot import Snapshot

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
except ImportError as e:  # the extra is optional; say how to get it
    raise ImportError("backend=ray needs Ray: pip install '.[ray]' in a clone of satrl (or pip install ray)") from e


@contextmanager
def stopped_if_cut_short(grace_s: float = 5.0) -> Iterator[None]:
    """Every process this one starts inside the block is stopped if the block raises (a Ctrl-C included). A
    ``ray.init`` cut short by a Ctrl-C has started part of a cluster and kept no handle on it: raylet and
    gcs_server die with this process, but the raylet's agents lingered a minute or more (issue 60). So the new
    descendants get SIGTERM, then SIGKILL after ``grace_s``; the exception goes on."""
    import psutil  # after ray: Ray ships it

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        yield
    except BaseException:
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        for p in started:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        for p in psutil.wait_procs(started, timeout=grace_s)[1]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        raise


def split_groups(P: int, n: int) -> list[list[int]]:
    """Contiguous, near-equal shards of the group indices ``0..P-1`` for ``n`` workers (no empty shard)."""
    bounds = [i * P // n for i in range(n + 1)]
    return [list(range(lo, hi)) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


class EngineActor:
    """The body of one engine actor (wrapped with ``ray.remote`` by :class:`RayBackend`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(spec.threads)
        self.worker = RolloutWorker(spec)

    def pid(self) -> int:
        return os.getpid()

    def rollout(self, b: int, versions: list[int], groups: list[int], puts: list[Put]) -> RolloutResult:
        """Groups ``groups`` of batch b; ``puts``: the weight messages of the versions they need (object refs,
        fetched only when the engine is not on that version). The driver owns the refs; the actor holds none
        between calls (the closing ``Keep`` forgets them)."""
        for message in puts:
            self.worker.receive(message)
        try:
            return self.worker.timed_rollout(RolloutRequest(b, versions), groups)
        finally:
            self.worker.receive(Keep(()))


@dataclass
class _Shard:
    """Groups ``groups`` of batch ``b`` on actor ``worker``; ``puts``: the weight messages of their versions only."""

    b: int
    worker: int
    groups: list[int]
    versions: list[int]
    puts: list[Put]
    failed_at: float | None = None  # first time its actor was found dead (bounds the restart wait)


@dataclass(frozen=True)
class RayOptions:
    """The Ray backend's settings (config: the ``ray:`` section and the engine's deadlines, ``backend_options``).

    Attributes:
        num_workers: engine actors (config ``ray.workers``).
        address: Ray cluster to join (``ray.address``); None starts a private local cluster (shut down by
            :meth:`RayBackend.close`). If Ray is already initialized in this process, that cluster is used and left
            running.
        num_gpus: GPUs reserved per actor (``ray.gpus``).
        max_restarts: how often Ray may restart each actor after it dies.
        restart_timeout_s: how long a shard waits for its dead actor to come back before the run fails.
        timeout_s: how long :meth:`RayBackend.result` waits for a batch (config ``engine.timeout_s``) before the
            actors that owe it count as hung: they are killed and restarted by Ray, their shards re-issued, with a
            fresh deadline (plus ``restart_timeout_s`` for the restart).
        max_hang_restarts: hangs in a row for one batch before :class:`~satrl.pipeline.engines_host.backends.EngineError`,
            one line (config ``engine.max_restarts``).
        transport: ``weights.transport``, a name in :data:`~satrl.weights.transports.TRANSPORTS` that this backend
            carries (``BACKENDS``' declaration; the config checks it).
    """

    num_workers: int = 1
    address: str | None = None
    num_gpus: float = 0.0
    max_restarts: int = 4
    restart_timeout_s: float = 300.0
    timeout_s: float = 3600.0
    max_hang_restarts: int = 3
    transport: str = "inproc"


class RayBackend:
    """Rollouts on ``options.num_workers`` Ray engine actors (implements
    :class:`~satrl.pipeline.engines_host.backends.Backend`).

    Args:
        spec: how each actor builds its rollout worker.
        options: the backend's settings (:class:`RayOptions`).
    """

    def __init__(self, spec: WorkerSpec, options: RayOptions = RayOptions()) -> None:
        num_workers, address, num_gpus = options.num_workers, options.address, options.num_gpus
        max_restarts, restart_timeout_s = options.max_restarts, options.restart_timeout_s
        timeout_s, max_hang_restarts = options.timeout_s, options.max_hang_restarts
        n, gpus = int(num_workers), float(num_gpus)
        if n < 1:
            raise ValueError(f"num_workers must be >= 1, got {n} (config ray.workers)")
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            with stopped_if_cut_short():  # a Ctrl-C while the cluster starts leaves none of it running
                if address:
                    ray.init(address=address, logging_level="WARNING")
                else:  # "local": never join a cluster that merely happens to run on this machine
                    cpus = max(os.cpu_count() or 1, n * spec.threads)
                    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
        actor_cls = ray.remote(EngineActor).options(
            num_cpus=spec.threads, num_gpus=gpus, max_restarts=max_restarts, max_task_retries=0
        )
        self._puts: dict[int, Put] = {}  # version -> its message (a ref into the object store)
        self.actors = [actor_cls.remote(spec) for _ in range(n)]
        self.restart_timeout_s, self.timeout_s, self.max_hang_restarts = restart_timeout_s, timeout_s, max_hang_restarts
        self.reissued = 0  # shards sent again after their actor died
        self.restarts = 0  # Ray restarts dead actors itself; perf/engine_restarts stays 0 here (reissued counts)
        self._pending: dict[Any, _Shard] = {}  # result ref -> shard in flight
        self._parts: dict[int, dict[int, list[Sample]]] = {}  # batch -> worker -> samples
        self._expected: dict[int, int] = {}  # batch -> number of shards
        self._busy = 0.0
        self._wait_ready(restart_timeout_s, f"num_cpus={spec.threads}, num_gpus={gpus}")

    # ------------------------------------------------------------------ Backend protocol
    def push(self, version: int, weights: Snapshot) -> None:
        """The trainer side of ``inproc`` here: the state dict goes into the object store once; the actors hold
        nothing between calls, so each shard's call carries the ``Put`` (its ref) of every version it needs."""
        self._puts[version] = Put(version, ray.put(weights.state()))

    def keep(self, versions: set[int]) -> None:
        """Drop the driver's refs to other versions; shards in flight keep their own refs alive."""
        self._puts = {v: m for v, m in self._puts.items() if v in versions}

    def submit(self, req: RolloutRequest) -> None:
        if req.b in self._expected:
            raise RuntimeError(f"batch {req.b} is already in flight on the Ray backend")
        missing = sorted(set(req.versions) - set(self._puts))
        if missing:
            raise WeightsMissing(f"batch {req.b} is generated with version(s) {missing}, never pushed to the Ray backend "
                                 f"(it holds {sorted(self._puts)})")  # fmt: skip
        shards = split_groups(len(req.versions), len(self.actors))
        self._expected[req.b], self._parts[req.b] = len(shards), {}
        for i, groups in enumerate(shards):
            puts = [self._puts[v] for v in sorted({req.versions[g] for g in groups})]
            self._launch(_Shard(req.b, i, groups, list(req.versions), puts))

    def result(self, b: int) -> list[Sample]:
        if b not in self._expected:
            raise RuntimeError(
                f"batch {b} was never submitted to the Ray backend (or was already handed over)"
            )
        deadline, hangs = time.monotonic() + self.timeout_s, 0
        while not self._complete(b):
            if time.monotonic() > deadline:  # a hang is a fault like a death: restart the actors that owe b
                hangs += 1
                stuck = sorted({s.worker for s in self._pending.values() if s.b == b})
                if hangs > self.max_hang_restarts:
                    raise EngineError(
                        f"batch {b} did not come back from Ray engine actor(s) {stuck} in {self.timeout_s:g} s "
                        f"(engine.timeout_s), {hangs} times in a row; giving up (engine.max_restarts={self.max_hang_restarts})"
                    )
                print(f"satrl: Ray engine actor(s) {stuck} hung: batch {b} not back in {self.timeout_s:g} s "
                      f"(engine.timeout_s); restarting them ({hangs}/{self.max_hang_restarts})", file=sys.stderr)  # fmt: skip
                for w in stuck:  # their shards fail with RayActorError and are re-issued to the restarted actor
                    ray.kill(self.actors[w], no_restart=False)
                # a fresh deadline for the new actors, which first have to start
                deadline = time.monotonic() + self.restart_timeout_s + self.timeout_s
            self._collect(timeout=1.0)
        return self._hand_over(b)

    def ready(self) -> dict[int, list[Sample]]:
        """Hand over every batch whose shards have all arrived (it leaves the backend)."""
        self._collect(timeout=0.0)
        return {b: self._hand_over(b) for b in sorted(self._expected) if self._complete(b)}

    def busy_seconds(self) -> float:
        """Engine seconds summed over actors (exceeds wall time when several actors work at once)."""
        return self._busy

    def close(self) -> None:
        for actor in self.actors if ray.is_initialized() else []:
            ray.kill(actor)  # no_restart=True: closing is not a crash
        self.actors, self._pending, self._puts = [], {}, {}
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
        self.owns_ray = False

    # ------------------------------------------------------------------ helpers
    def _wait_ready(self, timeout_s: float, needs: str) -> None:
        try:
            ray.get([a.pid.remote() for a in self.actors], timeout=timeout_s)
        except GetTimeoutError:
            msg = (
                f"{len(self.actors)} engine actor(s) did not start in {timeout_s:.0f} s; each needs {needs} "
                f"and the cluster has {ray.available_resources()} free. "
                "Use fewer ray.workers, fewer engine.threads or ray.gpus, or add nodes."
            )
            self.close()  # the loop never gets the backend, so nothing else would stop what we started
            raise RuntimeError(msg) from None

    def _launch(self, shard: _Shard) -> None:
        ref = self.actors[shard.worker].rollout.remote(shard.b, shard.versions, shard.groups, shard.puts)
        self._pending[ref] = shard

    def _collect(self, timeout: float) -> None:
        """Merge the shards that finished within ``timeout``; re-issue those whose actor died."""
        if not self._pending:
            return
        done, rest = ray.wait(list(self._pending), num_returns=1, timeout=timeout)
        if rest:  # whatever else is done by now, without waiting
            done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in done:
            shard = self._pending.pop(ref)
            try:
                done: RolloutResult = ray.get(ref)
            except RayActorError as e:  # the actor died with the shard in flight (a rollout error re-raises)
                self._reissue(shard, e)
                continue
            self._busy += done.busy_s
            self._parts[shard.b][shard.worker] = done.samples

    def _reissue(self, shard: _Shard, error: Exception) -> None:
        now = time.monotonic()
        shard.failed_at = shard.failed_at or now
        if now - shard.failed_at > self.restart_timeout_s:
            raise EngineError(
                f"engine actor {shard.worker} did not come back within {self.restart_timeout_s:.0f} s "
                f"(restarts exhausted or the node is gone); last error: {error}"
            ) from error
        time.sleep(0.2)  # a restarting actor refuses calls until it is back: do not spin
        self.reissued += 1
        self._launch(shard)

    def _complete(self, b: int) -> bool:
        return len(self._parts.get(b, {})) == self._expected.get(b, -1)

    def _hand_over(self, b: int) -> list[Sample]:
        parts = self._parts.pop(b)
        del self._expected[b]
        return sorted((s for part in parts.values() for s in part), key=lambda s: s.id)
