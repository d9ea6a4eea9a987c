"""The two backends on this machine: ``sequential`` (the worker in the caller's process, no overlap) and ``local``
(the engine in a child process, generating while the trainer trains).

Both take the same :class:`~satrl.pipeline.engines_host.worker.RolloutRequest` objects and return the same samples,
because sampling depends only on per-request seeds and the requested weights. The trainer stays in the
main process, where ``breakpoint()`` works. The registry that names them (and ``ray``) is
:mod:`satrl.pipeline.engines_host.backends`, which imports this module where a backend is built, so that the config
checks ``backend`` without importing torch.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing import resource_tracker

import torch

from satrl import faults
from satrl.pipeline.engines_host.engine_process import Done, Failed, Request, Rollout, Started, Stop, serve
from satrl.pipeline.engines_host.worker import RolloutRequest, RolloutWorker, WorkerSpec
from satrl.pipeline.errors import EngineError
from satrl.types import ENGINE_TIMEOUT_S, Sample
from satrl.weights.buckets import DEFAULT_BUCKET_BYTES
from satrl.weights.link import LinkDown, TrainerLink, cause, send
from satrl.weights.messages import Keep, Load, Put, Take
from satrl.weights.snapshot import Snapshot
from satrl.weights.transports import TRANSPORTS, TransportKind


class SequentialBackend:
    """Generation happens in the caller's process when the result is asked for: no overlap.

    ``transport``: ``weights.transport``; ``inproc``, the one this backend declares it carries (:data:`BACKENDS`):
    a version is a call into the worker.
    """

    def __init__(self, spec: WorkerSpec, transport: str = "inproc") -> None:
        self.worker = RolloutWorker(_for_transport(spec, TRANSPORTS.get(transport)))
        self.pending: dict[int, RolloutRequest] = {}
        self.restarts = 0  # the engine runs in this process, which cannot restart itself
        self._busy = 0.0

    def push(self, version: int, weights: Snapshot) -> None:
        """The trainer side of ``inproc`` here: the worker holds the snapshot's state dict (no copy)."""
        self.worker.receive(Put(version, weights.state()))

    def keep(self, versions: set[int]) -> None:
        self.worker.receive(Keep(tuple(sorted(versions))))

    def submit(self, req: RolloutRequest) -> None:
        self.pending[req.b] = req

    def result(self, b: int) -> list[Sample]:
        result = self.worker.timed_rollout(self.pending.pop(b))
        self._busy += result.busy_s
        return result.samples

    def ready(self) -> dict[int, list[Sample]]:
        return {}

    def busy_seconds(self) -> float:
        return self._busy

    def close(self) -> None:
        self.pending.clear()
        self.worker.close()


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """SIGINT blocked in this thread while a child process starts. The child inherits the block across fork and
    exec, keeps a terminal's Ctrl-C (which reaches the whole process group) pending while it imports, and discards
    it when it ignores SIGINT, first thing in :func:`serve`: the parent alone answers a Ctrl-C, in one line, and
    stops the child itself (issue 60: the engine process printed a traceback, even while it was importing). This
    process loses nothing: a Ctrl-C in the window is delivered when the block lifts, or at once through another
    thread. Ignoring SIGINT here instead (as before) dropped a Ctrl-C that came while an engine started."""
    resource_tracker.ensure_running()  # it unblocks SIGINT once its own process is up: start it outside the block
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class ProcessBackend:
    """The engine in its own process, generating while the trainer trains.

    Fault tolerance: a request stays *in flight* from :meth:`submit` until its result arrives. If the engine
    process dies (crash, OOM kill, SIGKILL) or hangs (no rollout for ``timeout_s`` seconds while it has work,
    e.g. SIGSTOP or a deadlock: it is then killed), a fresh one is started and every in-flight request is sent
    to it again, in batch order, with a fresh deadline. Samples depend only on per-request seeds and the weights
    sent, so the redone batches equal the lost ones; a batch is handed over once, so none is lost or
    duplicated. After ``max_restarts`` faults in a row without a result in between, :class:`EngineError`.

    Args:
        timeout_s: the most seconds the engine may go without returning a rollout while it has work
            (config ``engine.timeout_s``); the clock restarts at each result, when an idle engine gets work, and
            at each push (with ``lag.inflight_every`` a rollout waits for the trainer's next version, and a
            training step longer than the limit is not the engine's hang).
        start_timeout_s: the most seconds an engine process may take to start (``engine.start_timeout_s``).
        max_restarts: engine faults in a row tolerated (``engine.max_restarts``).
        transport: ``weights.transport``, a name in :data:`satrl.weights.transports.TRANSPORTS` (``inproc``: each
            version pickled onto the request queue; ``dist``: broadcast over a gloo group with the engine process;
            ``vllm``: the same broadcast, received and loaded by vLLM's weight-transfer API in vLLM's workers).
        bucket_bytes: ``dist``'s most bytes per bucket (``weights.bucket_mb``).
    """

    def __init__(
        self, spec: WorkerSpec, timeout_s: float = ENGINE_TIMEOUT_S, max_restarts: int = 3,
        start_timeout_s: float = ENGINE_TIMEOUT_S,
        transport: str = "inproc", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        self.timeout_s, self.max_restarts = timeout_s, max_restarts
        self.start_timeout_s = start_timeout_s
        self.ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        self.done: dict[int, list[Sample]] = {}
        self.in_flight: dict[int, RolloutRequest] = {}
        self.restarts = 0  # engine processes started after a death or hang, over the run
        self._deaths = 0  # faults since the last result
        self._busy = 0.0
        self.transport, self.kind = transport, TRANSPORTS.get(transport)
        self.spec = _for_transport(spec, self.kind)
        self.dtype, self.bucket_bytes = _weight_dtype(self.spec), bucket_bytes  # a broadcast's buckets
        self.held: dict[int, Snapshot] = {}  # what the engine side holds, mirrored: a restarted engine gets it again
        self.link = TrainerLink(timeout_s, start_timeout_s) if self.kind.broadcast else None
        self._start()

    def _send(self, message: Request) -> None:
        self.requests.put(pickle.dumps(message))

    def push(self, version: int, weights: Snapshot) -> None:
        """The trainer side of every transport on this backend: hand the engine process ``version``, once."""
        self.held[version] = weights
        try:
            self._send_weights(version)
        except LinkDown:  # dist: the engine died or hung; the restart feeds the new one this version too
            self._link_down()
            return
        if self.in_flight:  # an in-flight rollout may have waited for this version: the wait was the trainer's
            self._since = time.monotonic()

    def _send_weights(self, version: int) -> None:
        """Send the engine process the held ``version`` (a push, or the refeed of a restarted engine)."""
        weights = self.held[version]
        if self.link is None:  # inproc: the state dict itself, pickled onto the queue among the requests
            self._send(Put(version, weights.state()))
            return
        group = self.link.connected()  # dist, vllm: the engine's own group, joined while it started
        self._send(Load(version) if self.kind.own_engine_transfer else Take(version))  # its place among requests
        try:  # the kept buckets as they are (the trainer's, in the engine's dtype), or cut from a kept fp32 copy
            stream, tied = weights.stream(self.dtype, self.bucket_bytes)
            send(version, stream, tied, group=group)  # the engine receives it on its inbox's thread
        except (RuntimeError, ValueError) as e:  # gloo: the peer closed (died) or the send timed out (hung)
            # Under torchrun (a default group exists) torch's c10d logger, failing to name this group (it is not in
            # the world's map), turns gloo's RuntimeError into "ValueError: Process group ... is not initialized
            # in the world group map": the same lost engine.
            raise LinkDown(f"broadcast of version {version} to the engine process failed: {cause(e)}") from e

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self._send(Keep(tuple(sorted(versions))))

    def _link_down(self) -> None:
        """A broadcast failed: raise what a dead engine reported (bad input), else restart it (dead or hung)."""
        restarts = self.restarts
        self._drain(block=False)  # reads a reported error (raises it) or the dead child's EOF (restarts it)
        if self.restarts == restarts:
            self._restart(hung=self.proc.is_alive())

    def _start(self) -> None:
        with sigint_deferred():  # the child starts with SIGINT blocked and ignores it (serve)
            self._spawn()

    def _spawn(self) -> None:
        self.requests = self.ctx.Queue()
        self.results, child_end = self.ctx.Pipe(duplex=False)
        link = None if self.link is None else self.link.open(lambda: self.proc.is_alive())  # where the child joins
        # Not a daemon: daemonic processes may not have children, and vLLM starts its own. The child exits
        # when told (close), or by itself when this process is gone.
        args = (self.spec, self.requests, child_end, self.transport, link)
        self.proc = self.ctx.Process(target=serve, args=args, daemon=False)
        self.proc.start()
        faults.spawned()  # a test's list of fault signals moves on to the next child
        child_end.close()  # the child now holds the only write end: its death reads as EOF here
        self._started, self._since = False, time.monotonic()  # the deadline's clock: start-up first

    def _restart(self, hung: bool = False) -> None:
        if hung:  # a stopped or deadlocked process never exits by itself
            self.proc.kill()
        self.proc.join(timeout=10)
        limit = self.timeout_s if self._started else self.start_timeout_s
        key = "engine.timeout_s" if self._started else "engine.start_timeout_s"
        why = f"hung: no {'rollout' if self._started else 'start'} in {limit:g} s, {key}" if hung else (
            f"died: exit code {self.proc.exitcode}")  # fmt: skip
        self._deaths += 1
        if self._deaths > self.max_restarts:
            raise EngineError(
                f"engine process failed {self._deaths} times in a row without a result (last: {why}); giving up "
                f"(engine.max_restarts={self.max_restarts})"
            )
        self._stop()
        self._start()
        self.restarts += 1
        print(f"satrl: engine process {why}; restarted it ({self._deaths}/{self.max_restarts}), "
              f"re-issuing batches {sorted(self.in_flight)}", file=sys.stderr)  # fmt: skip
        try:
            self._refeed()
        except LinkDown:  # the new one failed too: the next restart (counted) re-issues everything
            return self._link_down()

    def _refeed(self) -> None:
        """The weights the lost engine held and its requests, each version just before the first request that
        needs it: an engine that holds one version at a time (``vllm``) only moves forward."""
        fed: set[int] = set()
        for b in sorted(self.in_flight):
            req = self.in_flight[b]
            due = sorted(v for v in self.held if v <= max(req.versions) and v not in fed)
            for v in due:
                self._send_weights(v)
            fed.update(due)
            self._send(Rollout(req))
        for v in sorted(set(self.held) - fed):
            self._send_weights(v)

    def submit(self, req: RolloutRequest) -> None:
        if not self.in_flight and self._started:  # an idle engine: this request's deadline starts now
            self._since = time.monotonic()
        self.in_flight[req.b] = req
        self._send(Rollout(req))

    def _overdue(self) -> bool:
        limit = self.timeout_s if self._started else self.start_timeout_s
        return bool(self.in_flight) and time.monotonic() - self._since > limit

    def _drain(self, block: bool) -> None:
        while True:
            try:
                if not self.results.poll(1.0 if block else 0.0):
                    if not block:
                        return
                    if not self.proc.is_alive():
                        self._restart()
                    elif self._overdue():
                        self._restart(hung=True)
                    continue
                result = pickle.loads(self.results.recv_bytes())  # noqa: S301 - from the child we spawned
            except (EOFError, OSError, pickle.UnpicklingError):  # the child died, perhaps mid-message
                self._restart()
                continue
            self._since = time.monotonic()
            match result:
                case Failed(error):
                    raise error
                case Started():
                    self._started = True
                case Done(done):
                    self._deaths = 0
                    self._busy += done.busy_s
                    if self.in_flight.pop(done.b, None) is not None:  # never hand a batch over twice
                        self.done[done.b] = done.samples
                    if block:
                        return

    def result(self, b: int) -> list[Sample]:
        while b not in self.done:
            self._drain(block=True)
        return self.done.pop(b)

    def ready(self) -> dict[int, list[Sample]]:
        """Hand over every batch that has arrived (it leaves the backend)."""
        self._drain(block=False)
        out, self.done = self.done, {}
        return out

    def busy_seconds(self) -> float:
        return self._busy

    def _stop(self) -> None:
        if self.proc.is_alive() and not self._overdue():  # a hung engine would not read the request to stop
            self._send(Stop())
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        # A dead child never drains its request queue: without this, exiting would wait forever for the
        # queue's feeder thread to flush (the 0 %-CPU hang after a failed engine start).
        self.requests.cancel_join_thread()
        self.requests.close()
        self.results.close()
        if self.link is not None:
            self.link.close()

    def close(self) -> None:
        self._stop()


def _for_transport(spec: WorkerSpec, kind: TransportKind) -> WorkerSpec:
    """The worker spec with what the transport needs of the engine (e.g. vLLM builds its weight-transfer engine at
    start-up)."""
    if not kind.engine_kwargs:
        return spec
    return replace(spec, engine_kwargs={**spec.engine_kwargs, **kind.engine_kwargs})


def _weight_dtype(spec: WorkerSpec) -> torch.dtype:
    """The dtype the engine holds its weights in: it rounds to it anyway, so a transport sends no more bytes."""
    from satrl.engines.numerics import resolve_numerics

    return resolve_numerics(spec.numerics).weights
