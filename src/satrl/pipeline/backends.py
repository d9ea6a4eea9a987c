"""Backends run the rollout worker: in this process (``sequential``) or in a child process (``local``).

Both take the same :class:`~satrl.pipeline.worker.RolloutRequest` objects and return the same samples,
because sampling depends only on per-request seeds and the requested weights. The trainer stays in the
main process, where ``breakpoint()`` works.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Protocol

from satrl.pipeline.worker import RolloutRequest, RolloutWorker, WorkerSpec
from satrl.types import Sample


class Backend(Protocol):
    def submit(self, req: RolloutRequest) -> None: ...

    def result(self, b: int) -> list[Sample]: ...

    def ready(self) -> dict[int, list[Sample]]: ...

    def busy_seconds(self) -> float: ...

    def close(self) -> None: ...


class SequentialBackend:
    """Generation happens in the caller's process when the result is asked for: no overlap."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.worker = RolloutWorker(spec)
        self.pending: dict[int, RolloutRequest] = {}
        self._busy = 0.0

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


def _serve(spec: WorkerSpec, requests: mp.Queue, results: mp.Queue) -> None:
    """Child-process loop. Payloads are pickled by hand so tensors are copied, never fd-shared."""
    try:
        worker = RolloutWorker(spec)
    except Exception:  # e.g. an engine that refuses its config: the parent raises it with this traceback
        results.put(pickle.dumps((-1, 0.0, RuntimeError(f"the engine process could not start:\n{traceback.format_exc()}"))))
        return
    try:
        _serve_loop(worker, requests, results)
    finally:  # a child process skips atexit handlers: stop the engine's own processes (vLLM) here
        worker.close()


def _serve_loop(worker: RolloutWorker, requests: mp.Queue, results: mp.Queue) -> None:
    parent = mp.parent_process()
    while True:
        try:
            payload = requests.get(timeout=5.0)
        except queue.Empty:  # not a daemon (engines such as vLLM spawn processes), so leave with the parent
            if parent is not None and not parent.is_alive():
                return
            continue
        if payload is None:
            return
        req: RolloutRequest = pickle.loads(payload)
        t0 = time.perf_counter()
        try:
            out: object = worker.rollout(req)
        except Exception:  # the parent re-raises it with the child's traceback
            out = RuntimeError(f"rollout of batch {req.b} failed in the engine process:\n{traceback.format_exc()}")
        results.put(pickle.dumps((req.b, time.perf_counter() - t0, out)))


class ProcessBackend:
    """The engine in its own process, generating while the trainer trains."""

    def __init__(self, spec: WorkerSpec, timeout_s: float = 3600.0) -> None:
        ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        # Not a daemon: daemonic processes may not have children, and vLLM starts its own. The child exits
        # when told (close), or by itself when this process is gone.
        self.proc = ctx.Process(target=_serve, args=(spec, self.requests, self.results), daemon=False)
        self.proc.start()
        self.timeout_s = timeout_s
        self.done: dict[int, list[Sample]] = {}
        self._busy = 0.0

    def submit(self, req: RolloutRequest) -> None:
        self.requests.put(pickle.dumps(req))

    def _drain(self, block: bool) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                b, busy, out = pickle.loads(self.results.get(timeout=1.0 if block else 0.0))
            except queue.Empty:
                if not block:
                    return
                if not self.proc.is_alive():
                    raise RuntimeError(f"engine process died (exit code {self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no rollout from the engine process in {self.timeout_s:.0f} s") from None
                continue
            if isinstance(out, Exception):
                raise out
            self._busy += busy
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

    def close(self) -> None:
        if self.proc.is_alive():
            self.requests.put(None)
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)


def _ray(spec: WorkerSpec) -> Backend:
    from satrl.pipeline.ray_backend import RayBackend  # optional extra: satrl[ray]

    return RayBackend(spec)


BACKENDS: dict[str, Callable[[WorkerSpec], Backend]] = {
    "sequential": SequentialBackend,
    "local": ProcessBackend,
    "ray": _ray,
}


def make_backend(name: str, spec: WorkerSpec) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid choices: {sorted(BACKENDS)}")
    return BACKENDS[name](spec)
