"""Backends run the rollout worker: in this process (``sequential``) or in a child process (``local``).

Both take the same :class:`~satrl.pipeline.worker.RolloutRequest` objects and return the same samples,
because sampling depends only on per-request seeds and the requested weights. The trainer stays in the
main process, where ``breakpoint()`` works.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import pickle
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Protocol

import torch

from satrl import faults
from satrl.models.loading import PolicyLoadError
from satrl.pipeline.weights import DistTransport, Inbox, InprocTransport, Link, LinkDown, receive
from satrl.pipeline.worker import RolloutRequest, RolloutWorker, WorkerSpec
from satrl.registry import Registry
from satrl.tasks import TaskError
from satrl.types import ContextLengthError, Sample


class EngineError(RuntimeError):
    """The engine process failed (died or hung) more often in a row than allowed: one line for the user, who
    can continue the run with ``satrl train --resume`` from its last checkpoint."""


READY = -2  # the batch number of the engine process's "started" message


class Backend(Protocol):
    """Where the rollout worker runs. ``restarts``: engine processes started again after a fault, over the run
    (``perf/engine_restarts``)."""

    restarts: int

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Hand the engine side the weights of ``version``, once; it holds them until :meth:`keep` drops them."""

    def keep(self, versions: set[int]) -> None:
        """The engine side may forget every version not in ``versions``."""

    def submit(self, req: RolloutRequest) -> None: ...

    def result(self, b: int) -> list[Sample]: ...

    def ready(self) -> dict[int, list[Sample]]: ...

    def busy_seconds(self) -> float: ...

    def close(self) -> None: ...


class SequentialBackend:
    """Generation happens in the caller's process when the result is asked for: no overlap."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.worker = RolloutWorker(spec)
        self.transport = InprocTransport(lambda message: receive(self.worker, message))
        self.pending: dict[int, RolloutRequest] = {}
        self.restarts = 0  # the engine runs in this process, which cannot restart itself
        self._busy = 0.0

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.transport.push(version, state)

    def keep(self, versions: set[int]) -> None:
        self.transport.keep(versions)

    def submit(self, req: RolloutRequest) -> None:
        self.pending[req.b] = req

    def result(self, b: int) -> list[Sample]:
        t0 = time.perf_counter()
        samples = self.worker.rollout(self.pending.pop(b))
        self._busy += time.perf_counter() - t0
        return samples

    def ready(self) -> dict[int, list[Sample]]:
        return {}

    def busy_seconds(self) -> float:
        return self._busy

    def close(self) -> None:
        self.pending.clear()
        self.worker.close()


def _serve(spec: WorkerSpec, requests: mp.Queue, results: Connection, link: Link | None = None,
           in_engine: bool = False) -> None:  # fmt: skip
    """Child-process loop. Payloads are pickled by hand so tensors are copied, never fd-shared. Results go
    back over a pipe whose only writer is this process, so the parent sees this process's death as EOF
    (even mid-message) instead of waiting forever; a sender thread keeps generation from waiting on the
    parent to read. ``link``: transport ``dist``, join the trainer's group first (weights arrive there while
    the engine loads); with ``in_engine`` (transport ``vllm``) the engine's own workers join it instead."""
    inbox = Inbox(link) if link is not None and not in_engine else None
    outbox, sender = _sender(results)
    try:
        try:
            worker = RolloutWorker(spec)
        except (TaskError, PolicyLoadError) as e:  # bad user input: the parent raises it as it is (one line)
            outbox.put(pickle.dumps((-1, 0.0, e)))
            return
        except Exception:  # e.g. an engine that refuses its config: the parent raises it with this traceback
            outbox.put(pickle.dumps((-1, 0.0, RuntimeError(f"the engine process could not start:\n{traceback.format_exc()}"))))
            return
        if in_engine and link is not None:
            worker.open_transfer(link)
        outbox.put(pickle.dumps((READY, 0.0, None)))  # start-up is over: the rollout deadline starts now
        try:
            _serve_loop(worker, requests, outbox, inbox)
        finally:  # a child process skips atexit handlers: stop the engine's own processes (vLLM) here
            worker.close()
    finally:
        outbox.put(None)
        sender.join(timeout=60)


def _sender(results: Connection) -> tuple[queue.Queue, threading.Thread]:
    """A queue whose items a thread sends over ``results`` until it reads None. A fault (chaos tests) first
    lets what is queued reach the parent: it models a crash in the work that follows, not in the delivery of
    work done (``faults.on_kill``)."""
    outbox: queue.Queue = queue.Queue()

    def send() -> None:
        while (item := outbox.get()) is not None:
            try:
                results.send_bytes(item)
            except OSError:  # the parent is gone
                return
            finally:
                outbox.task_done()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    faults.on_kill(lambda: _flushed(outbox))
    return outbox, sender


def _flushed(outbox: queue.Queue, timeout_s: float = 30.0) -> None:
    """Wait (at most ``timeout_s``: the parent may not be reading) until every queued result is sent."""
    waiter = threading.Thread(target=outbox.join, daemon=True)
    waiter.start()
    waiter.join(timeout_s)


class _Stop(Exception):
    """The parent said stop (or is gone) while an in-flight rollout waited for weights."""


def _serve_loop(worker: RolloutWorker, requests: mp.Queue, outbox: queue.Queue, inbox: Inbox | None) -> None:
    parent = mp.parent_process()
    pending: collections.deque[RolloutRequest] = collections.deque()

    def take() -> None:  # one message: weights and keeps apply now, rollouts queue up in order
        while True:
            try:
                payload = requests.get(timeout=5.0)
                break
            except queue.Empty:  # not a daemon (engines such as vLLM spawn processes), so leave with the parent
                if parent is not None and not parent.is_alive():
                    raise _Stop from None
        if payload is None:
            raise _Stop
        req = receive(worker, pickle.loads(payload), inbox)  # a dist marker waits for its broadcast
        if req is not None:
            pending.append(req)

    worker.wait = take  # an in-flight rollout reads weights pushed after it started (lag.inflight_every)
    while True:
        try:
            while not pending:
                take()
            req = pending.popleft()
            t0 = time.perf_counter()
            out: object = _rollout(worker, req)
        except _Stop:
            return
        outbox.put(pickle.dumps((req.b, time.perf_counter() - t0, out)))


def _rollout(worker: RolloutWorker, req: RolloutRequest) -> object:
    """The samples of ``req``, or the exception the parent raises (user errors as they are, one line)."""
    try:
        return worker.rollout(req)
    except _Stop:  # not a failure of this batch: the loop ends
        raise
    except (TaskError, ContextLengthError) as e:  # bad user input: the parent raises it as it is (one line)
        return e
    except Exception:  # the parent re-raises it with the child's traceback
        return RuntimeError(f"rollout of batch {req.b} failed in the engine process:\n{traceback.format_exc()}")


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
        transport: ``inproc`` (each version pickled onto the request queue), ``dist`` (broadcast over a gloo
            group with the engine process, ``pipeline.weights.DistTransport``) or ``vllm`` (the same broadcast,
            received and loaded by vLLM's weight-transfer API in vLLM's workers); ``weights.transport``.
        bucket_bytes: ``dist``'s most bytes per bucket (``weights.bucket_mb``).
    """

    def __init__(
        self, spec: WorkerSpec, timeout_s: float = 1800.0, max_restarts: int = 3, start_timeout_s: float = 1800.0,
        transport: str = "inproc", bucket_bytes: int = 256 * 2**20,
    ) -> None:
        self.spec, self.timeout_s, self.max_restarts = spec, timeout_s, max_restarts
        self.start_timeout_s = start_timeout_s
        self.ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        self.done: dict[int, list[Sample]] = {}
        self.in_flight: dict[int, RolloutRequest] = {}
        self.restarts = 0  # engine processes started after a death or hang, over the run
        self._deaths = 0  # faults since the last result
        self._busy = 0.0
        self.transport = self._transport(transport, bucket_bytes)
        self._start()

    def _transport(self, name: str, bucket_bytes: int) -> InprocTransport | DistTransport:
        if name == "inproc":
            return InprocTransport(self._send)  # each version pickled once, on this (the trainer's) thread
        if name not in ("dist", "vllm"):
            raise ValueError(f"weights.transport: unknown transport {name!r}")
        from satrl.engines.torch_engine import resolve_numerics

        if name == "vllm":  # vLLM builds its weight-transfer engine at start-up
            self.spec = replace(self.spec, engine_kwargs={**self.spec.engine_kwargs, "weight_transfer": True})
        dtype = resolve_numerics(self.spec.numerics).weights  # the engine rounds to it anyway: same weights, fewer bytes
        return DistTransport(self._send, dtype, bucket_bytes, self.timeout_s, self.start_timeout_s, marker=name)

    def _send(self, message: tuple) -> None:
        self.requests.put(pickle.dumps(message))

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        try:
            self.transport.push(version, state)
        except LinkDown:  # dist: the engine died or hung; the restart feeds the new one this version too
            self._link_down()
            return
        if self.in_flight:  # an in-flight rollout may have waited for this version: the wait was the trainer's
            self._since = time.monotonic()

    def keep(self, versions: set[int]) -> None:
        self.transport.keep(versions)

    def _link_down(self) -> None:
        """A broadcast failed: raise what a dead engine reported (bad input), else restart it (dead or hung)."""
        restarts = self.restarts
        self._drain(block=False)  # reads a reported error (raises it) or the dead child's EOF (restarts it)
        if self.restarts == restarts:
            self._restart(hung=self.proc.is_alive())

    def _start(self) -> None:
        self.requests = self.ctx.Queue()
        self.results, child_end = self.ctx.Pipe(duplex=False)
        dist_ = isinstance(self.transport, DistTransport)
        link = self.transport.open(lambda: self.proc.is_alive()) if dist_ else None
        in_engine = dist_ and self.transport.marker == "vllm"
        # Not a daemon: daemonic processes may not have children, and vLLM starts its own. The child exits
        # when told (close), or by itself when this process is gone.
        self.proc = self.ctx.Process(target=_serve, args=(self.spec, self.requests, child_end, link, in_engine),
                                     daemon=False)  # fmt: skip
        self.proc.start()
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
            due = sorted(v for v in self.transport.held if v <= max(req.versions) and v not in fed)
            self.transport.replay(due)
            fed.update(due)
            self._send(("rollout", req))
        self.transport.replay(sorted(set(self.transport.held) - fed))

    def submit(self, req: RolloutRequest) -> None:
        if not self.in_flight and self._started:  # an idle engine: this request's deadline starts now
            self._since = time.monotonic()
        self.in_flight[req.b] = req
        self._send(("rollout", req))

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
                b, busy, out = pickle.loads(self.results.recv_bytes())
            except (EOFError, OSError, pickle.UnpicklingError):  # the child died, perhaps mid-message
                self._restart()
                continue
            if isinstance(out, Exception):
                raise out
            self._since = time.monotonic()
            if b == READY:
                self._started = True
                continue
            self._deaths = 0
            self._busy += busy
            if self.in_flight.pop(b, None) is not None:  # never hand a batch over twice
                self.done[b] = out
            if not block:
                continue
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
            self.requests.put(None)
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        # A dead child never drains its request queue: without this, exiting would wait forever for the
        # queue's feeder thread to flush (the 0 %-CPU hang after a failed engine start).
        self.requests.cancel_join_thread()
        self.requests.close()
        self.results.close()
        if isinstance(self.transport, DistTransport):
            self.transport.close()

    def close(self) -> None:
        self._stop()


def _ray(spec: WorkerSpec, **options) -> Backend:
    from satrl.pipeline.ray_backend import RayBackend  # optional extra: ray

    return RayBackend(spec, **options)


# name (the config's ``backend``) -> builder(spec, **options) -> Backend; a new backend is one more register call.
BACKENDS: Registry[Callable[..., Backend]] = Registry("backend")
BACKENDS.register("sequential", SequentialBackend)
BACKENDS.register("local", ProcessBackend)
BACKENDS.register("ray", _ray)


def make_backend(name: str, spec: WorkerSpec, **options) -> Backend:
    """The backend ``name`` (the config's ``backend``) running workers built from ``spec``; ``options`` are its
    own settings (``pipeline.setup.backend_options``: the engine's deadlines and restarts, the ``ray:`` section)."""
    return BACKENDS.get(name)(spec, **options)
