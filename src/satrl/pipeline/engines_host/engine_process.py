"""The engine process of the ``local`` backend: its loop, and the typed messages it exchanges with the parent.

Requests (parent -> engine, one ``multiprocessing`` queue, in order): the weight messages of the run's transport
(:mod:`satrl.weights.messages`), :class:`Rollout` and :class:`Stop`. Results (engine -> parent, a pipe whose
only writer is the engine process): :class:`Started`, :class:`Done` and :class:`Failed`.

Both directions are pickled (``pickle.dumps`` by hand, so tensors are copied, never fd-shared). That is the one
place satrl unpickles, and it is safe for the reason multiprocessing itself is: both ends are processes of the
same run, the parent spawned the child, and nothing on disk or on a network socket is ever unpickled
(docs/design.md, "What crosses a process boundary").
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import pickle
import queue
import signal
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from satrl import faults
from satrl.models.loading import PolicyLoadError
from satrl.pipeline.engines_host.worker import RolloutRequest, RolloutResult, RolloutWorker, WorkerSpec
from satrl.tasks import TaskError
from satrl.types import ContextLengthError
from satrl.weights.link import Inbox, Link
from satrl.weights.messages import WeightMessage
from satrl.weights.transports import TRANSPORTS


@dataclass(frozen=True)
class Rollout:
    """Generate this batch once every version it needs is held."""

    request: RolloutRequest


@dataclass(frozen=True)
class Stop:
    """Leave the loop (the run is over, or the engine is being replaced)."""


@dataclass(frozen=True)
class Started:
    """The engine is built: start-up is over and the rollout deadline starts now."""


@dataclass(frozen=True)
class Done:
    """A rollout's result: the samples of one batch and the engine seconds they took."""

    result: RolloutResult


@dataclass(frozen=True)
class Failed:
    """The engine could not start or a rollout failed: the parent raises ``error`` (user errors as they are, one
    line; anything else with the engine process's traceback)."""

    error: Exception


Request = WeightMessage | Rollout | Stop
Result = Started | Done | Failed


def serve(spec: WorkerSpec, requests: mp.Queue, results: Connection, transport: str, link: Link | None) -> None:
    """Child-process main. Results go back over a pipe whose only writer is this process, so the parent sees its
    death as EOF (even mid-message) instead of waiting forever; a sender thread keeps generation from waiting on
    the parent to read. ``transport`` names ``weights.transport``; ``link``: where its broadcasts come from
    (``dist``, ``vllm``), None for ``inproc``, whose messages carry the weights."""
    # A Ctrl-C reaches the whole process group: the parent answers it and stops this process. It started with
    # SIGINT blocked (local_backends.sigint_deferred): ignoring discards one that came while it imported, and the
    # engine's own processes (vLLM) inherit the ignore.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    kind = TRANSPORTS.get(transport)
    # dist: join the trainer's group before the engine is built, so the first version arrives while it loads
    inbox = Inbox(link) if link is not None and not kind.own_engine_transfer else None
    outbox, sender = sender_thread(results)
    requests_in = _Requests(requests)
    try:
        try:  # an in-flight rollout reads weights pushed after it started (wait)
            worker = RolloutWorker(spec, wait=requests_in.take, inbox=inbox)
        except (TaskError, PolicyLoadError) as e:  # bad user input: the parent raises it as it is (one line)
            outbox.put(pickle.dumps(Failed(e)))
            return
        except Exception:  # e.g. an engine that refuses its config: the parent raises it with this traceback
            outbox.put(pickle.dumps(Failed(RuntimeError(f"the engine process could not start:\n{traceback.format_exc()}"))))
            return
        if link is not None and kind.own_engine_transfer:  # vllm: the engine's own workers join the group
            worker.open_transfer(link)
        requests_in.worker = worker
        outbox.put(pickle.dumps(Started()))
        try:
            _serve_loop(worker, requests_in, outbox)
        finally:  # a child process skips atexit handlers: stop the engine's own processes (vLLM) here
            worker.close()
    finally:
        outbox.put(None)
        sender.join(timeout=60)


def sender_thread(results: Connection) -> tuple[queue.Queue, threading.Thread]:
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


class _Stopped(Exception):
    """The parent said stop (or is gone) while an in-flight rollout waited for weights."""


class _Requests:
    """The request queue as the engine process reads it: weight messages apply at once (the worker's
    :meth:`~satrl.pipeline.engines_host.worker.RolloutWorker.receive`), rollouts queue up in order. The worker's
    ``wait`` is :meth:`take`, so an in-flight rollout that needs a version not yet held reads on, queueing the
    requests behind it."""

    def __init__(self, requests: mp.Queue) -> None:
        self.requests = requests
        self.worker: RolloutWorker | None = None  # set once built: no message is read before
        self.pending: collections.deque[RolloutRequest] = collections.deque()

    def take(self) -> None:
        """Read one message: a weight message applies now (a dist Take waits for its broadcast), a rollout queues."""
        match self._next():
            case Stop():
                raise _Stopped
            case Rollout(req):
                self.pending.append(req)
            case message:
                self.worker.receive(message)

    def next_rollout(self) -> RolloutRequest:
        while not self.pending:
            self.take()
        return self.pending.popleft()

    def _next(self) -> Request:
        parent = mp.parent_process()
        while True:
            try:
                return pickle.loads(self.requests.get(timeout=5.0))  # noqa: S301 - from the parent that spawned us
            except queue.Empty:  # not a daemon (engines such as vLLM spawn processes), so leave with the parent
                if parent is not None and not parent.is_alive():
                    raise _Stopped from None


def _serve_loop(worker: RolloutWorker, inbox: _Requests, outbox: queue.Queue) -> None:
    while True:
        try:
            out: Result = _rollout(worker, inbox.next_rollout())
        except _Stopped:
            return
        outbox.put(pickle.dumps(out))


def _rollout(worker: RolloutWorker, req: RolloutRequest) -> Result:
    """The samples of ``req``, or the error the parent raises (user errors as they are, one line)."""
    try:
        result = worker.timed_rollout(req)
    except _Stopped:  # not a failure of this batch: the loop ends
        raise
    except (TaskError, ContextLengthError) as e:  # bad user input: the parent raises it as it is (one line)
        return Failed(e)
    except Exception:  # the parent re-raises it with the child's traceback
        return Failed(RuntimeError(f"rollout of batch {req.b} failed in the engine process:\n{traceback.format_exc()}"))
    return Done(result)
