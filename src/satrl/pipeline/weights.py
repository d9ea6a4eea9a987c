"""Weight sync between the trainer and the engine side: each version travels once, and requests name versions.

A rollout request never carries weights (:class:`~satrl.pipeline.worker.RolloutRequest`). Instead the loop's
:class:`~satrl.pipeline.rollouts.Rollouts` pushes a version's weights to the backend once, when the snapshot store
keeps it, and tells the backend which versions it still keeps when it forgets one; the engine side holds exactly
those (:meth:`RolloutWorker.put`, :meth:`RolloutWorker.keep`). A batch whose version the engine side does not hold
fails with :class:`~satrl.pipeline.worker.WeightsMissing`, never silently runs on other weights.

Transports (``weights.transport``):

- ``inproc`` (:class:`InprocTransport`): a call in this process (``sequential``) or one pickled message on the
  ``local`` backend's request queue. ``ray`` puts each version into Ray's object store once.
- ``dist`` (:class:`DistTransport`, ``local`` only): the trainer and the engine process form a two-process gloo
  group of their own (:class:`Link`: a TCPStore the trainer owns, one key prefix per engine process, so a
  restarted engine joins a fresh group). Each version is broadcast once as buckets in the engine's dtype
  (:mod:`satrl.weights.dist`: raw bytes and JSON headers, nothing pickled); the request queue carries only a
  ``("dist", version)`` marker that orders it among keep lists and requests. The engine process receives on a
  thread of its own (:class:`Inbox`), so a push never waits for a generation to finish.

- ``vllm`` (a :class:`DistTransport` with the ``vllm`` marker; ``local`` backend, ``engine.name=vllm``): the same
  group and wire, but the receiving end is inside vLLM's workers: vLLM's weight-transfer API
  (:mod:`satrl.engines.vllm_transfer`, registered as a vLLM weight-transfer engine) receives each version on a
  thread of the worker and, when the queue's marker comes up, loads it with vLLM's layerwise reload
  (:meth:`~satrl.engines.vllm_engine.VLLMEngine.receive_weights`). No host copy in the engine process and no
  safetensors round trip. The engine holds one version, the last it loaded (:data:`~satrl.pipeline.worker.IN_ENGINE`).
"""

from __future__ import annotations

import datetime
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from satrl.config import ConfigError
from satrl.pipeline.worker import RolloutRequest, RolloutWorker
from satrl.weights import dist as wdist
from satrl.weights.buckets import DEFAULT_BUCKET_BYTES, aliases, state_aliases, state_buckets, unpack

# ("weights", version, state) | ("dist", version) | ("keep", [versions]) | ("rollout", RolloutRequest)
Message = tuple


class InprocTransport:
    """Feeds one engine worker through ``send`` (a message to :func:`receive` on the engine side) and mirrors
    what it holds, so that a restarted engine can be fed again (:meth:`replay`). The mirror shares the snapshot
    store's tensors: no copy on this side."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        self.send = send
        self.held: dict[int, dict[str, torch.Tensor]] = {}

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.held[version] = state
        self.send(("weights", version, state))

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self.send(("keep", sorted(versions)))

    def replay(self, versions: list[int]) -> None:
        """Feed a fresh engine these held versions again, in order (the backend interleaves them with the
        requests it re-issues)."""
        for v in versions:
            self.send(("weights", v, self.held[v]))


def receive(worker: RolloutWorker, message: Message, inbox: Inbox | None = None) -> RolloutRequest | None:
    """Apply a weights or keep message to ``worker``; a rollout message returns its request (to run). A
    ``dist`` marker takes that version from ``inbox`` (waiting for its broadcast to arrive)."""
    kind, *body = message
    if kind == "weights":
        worker.put(body[0], body[1])
    elif kind == "dist" and inbox is not None:
        worker.put(body[0], inbox.take(body[0]))
    elif kind == "vllm":
        worker.load_in_engine(body[0])
    elif kind == "keep":
        worker.keep(set(body[0]))
    elif kind == "rollout":
        return body[0]
    else:
        raise ValueError(f"unknown weight-sync message {kind!r}")
    return None


def snapshot_source(trainer, transport: str, dtype: torch.dtype, bucket_bytes: int,
                    decompose: bool) -> Callable[[], dict[str, torch.Tensor]]:  # fmt: skip
    """What the snapshot store keeps of a version that pending batches need (``Rollouts.offer``): the trainer's
    full fp32 CPU copy (``Trainer.weights``) under ``inproc``, and whenever the Δπ/Δimpl split
    (``diagnostics.decompose``) reads it, since its log-probs must be today's; otherwise (``dist``) one copy in
    the engine's ``dtype``, assembled from the trainer's bucket stream (``Trainer.weight_buckets``, gathered from
    the shards under data parallel) without ever building an fp32 one. The engine rounds to ``dtype`` anyway, so
    it generates with the same weights either way."""
    if transport == "inproc" or decompose:
        return trainer.weights
    return lambda: unpack(trainer.weight_buckets(dtype, bucket_bytes), aliases(trainer.model))


def check_snapshots(snapshots: dict[int, dict[str, torch.Tensor]], decompose: bool) -> None:
    """Refuse (one line) to resume with ``diagnostics.decompose`` on from a checkpoint whose kept snapshots are
    engine-dtype copies (written by a ``dist`` run without it): the split needs the exact fp32 weights."""
    low = sorted(v for v, s in snapshots.items() if any(t.dtype != torch.float32 for t in s.values() if t.is_floating_point()))
    if decompose and low:
        raise ConfigError(f"diagnostics.decompose=true: the checkpoint keeps versions {low} in the engine's dtype only "
                         f"(saved by a weights.transport=dist run without it); resume with diagnostics.decompose=false")  # fmt: skip


def payload_weights(obj: Any) -> bool:
    """Whether ``obj`` holds a tensor anywhere in its attributes (the check that requests carry no weights)."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(payload_weights(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(payload_weights(v) for v in obj)
    return hasattr(obj, "__dict__") and payload_weights(vars(obj))


# -- dist: a two-process group between the trainer and the engine process --------------------------------------
class LinkDown(RuntimeError):
    """The engine process did not join its group, or a broadcast to it failed (it died or hung): the backend
    restarts it, and the restart feeds the fresh one every held version again."""


@dataclass(frozen=True)
class Link:
    """Where an engine process joins the trainer's group: the trainer's TCPStore and this process's key prefix."""

    port: int
    prefix: str
    host: str = "127.0.0.1"


def _gloo(store, rank: int, host: str, timeout_s: float) -> dist.ProcessGroup:
    """A two-rank gloo group on ``store``, outside torch's default group (a torchrun trainer already has one),
    bound to the loopback interface: the engine process is on this machine."""
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(store, rank, 2, opts)


def join(link: Link, timeout_s: float = 7 * 86400.0) -> dist.ProcessGroup:
    """Engine process: join the trainer's group as rank 1. The long timeout is the wait for the next version,
    which lasts as long as the trainer trains (the trainer's side has the short one: ``engine.timeout_s``)."""
    store = dist.TCPStore(link.host, link.port, None, False, datetime.timedelta(seconds=timeout_s))
    return _gloo(dist.PrefixStore(link.prefix, store), 1, link.host, timeout_s)


class Inbox:
    """Engine process: receives broadcast versions on a thread of its own, so the trainer's push never waits for
    a generation; :meth:`take` hands one to the worker when the queue's marker for it comes up."""

    def __init__(self, link: Link) -> None:
        self._got: dict[int, dict[str, torch.Tensor]] = {}
        self._error: str | None = None
        self._cv = threading.Condition()
        threading.Thread(target=self._run, args=(link,), daemon=True).start()  # blocked in a receive at exit

    def _run(self, link: Link) -> None:
        try:
            group = join(link)
            while True:
                version, state = wdist.receive(0, group)
                with self._cv:
                    self._got[version] = state
                    self._cv.notify_all()
        except Exception:  # the trainer closed the group (end of run) or died: only a take() still waiting cares
            with self._cv:
                self._error = traceback.format_exc()
                self._cv.notify_all()

    def take(self, version: int) -> dict[str, torch.Tensor]:
        with self._cv:
            self._cv.wait_for(lambda: version in self._got or self._error is not None)
            if version in self._got:
                return self._got.pop(version)
            raise RuntimeError(f"the weights of version {version} never arrived over the trainer's group:\n{self._error}")


def _cause(e: BaseException) -> str:
    """The first line of the innermost error behind ``e`` (gloo's, not the logger's that replaced it)."""
    while e.__context__ is not None and e.__cause__ is None and isinstance(e, ValueError):
        e = e.__context__
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class DistTransport:
    """Trainer side of ``dist``: feeds one engine process at a time over its own group and mirrors what it holds
    (sharing the snapshot store's tensors, no copy), so that a restarted engine is fed again (:meth:`replay`).

    ``send``: a message onto the request queue; ``dtype``: the engine's weight dtype (the buckets'); ``timeout_s``:
    the most seconds a broadcast may wait for the engine process (``engine.timeout_s``), ``start_timeout_s`` the
    most it may take to join (``engine.start_timeout_s``). ``marker``: the queue message's kind, ``"dist"`` (the
    engine process receives) or ``"vllm"`` (vLLM's workers receive, ``weights.transport=vllm``)."""

    def __init__(self, send: Callable[[Message], None], dtype: torch.dtype, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout_s: float = 1800.0, start_timeout_s: float = 1800.0, marker: str = "dist") -> None:  # fmt: skip
        self.send, self.dtype, self.bucket_bytes, self.marker = send, dtype, bucket_bytes, marker
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.held: dict[int, dict[str, torch.Tensor]] = {}
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=start_timeout_s),
                                   wait_for_workers=False)  # fmt: skip
        self._generation = 0
        self._group: dist.ProcessGroup | None = None
        self._join_error: Exception | None = None
        self._joining: threading.Thread | None = None
        self._alive: Callable[[], bool] = lambda: True

    def open(self, alive: Callable[[], bool]) -> Link:
        """A fresh group for the next engine process (``alive``: whether it still runs); joined in the background
        while it starts, and waited for at the first push."""
        self._generation += 1
        link = Link(self.store.port, f"engine{self._generation}/")
        self._group, self._alive, self._join_error = None, alive, None
        self._joining = threading.Thread(target=self._join, args=(link, self._generation), daemon=True)
        self._joining.start()
        return link

    def _join(self, link: Link, generation: int) -> None:
        try:
            group = _gloo(dist.PrefixStore(link.prefix, self.store), 0, link.host, self.start_timeout_s)
            group.set_timeout(datetime.timedelta(seconds=self.timeout_s))  # joined: now the hang deadline
        except Exception as e:  # noqa: BLE001 - reported by the push that waits for it
            group, error = None, e
        else:
            error = None
        if generation == self._generation:  # a replaced engine's late join must not overwrite its successor's
            self._group, self._join_error = group, error

    def close(self) -> None:
        self._group = None  # the engine process is gone; its group with it

    def _connected(self) -> dist.ProcessGroup:
        while self._joining is not None and self._joining.is_alive():
            self._joining.join(0.5)
            if not self._alive():
                raise LinkDown("the engine process exited before joining the trainer's group")
        if self._group is None:
            raise LinkDown(f"the engine process did not join the trainer's group: {self._join_error}")
        return self._group

    def push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.held[version] = state
        self._broadcast(version)

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self.send(("keep", sorted(versions)))

    def replay(self, versions: list[int]) -> None:
        """Feed a fresh engine these held versions again, in order (the backend interleaves them with the
        requests it re-issues)."""
        for v in versions:
            self._broadcast(v)

    def _broadcast(self, version: int) -> None:
        group = self._connected()
        state = self.held[version]
        self.send((self.marker, version))  # orders the version among keep lists and requests on the queue
        try:
            wdist.send(version, state_buckets(state, self.dtype, self.bucket_bytes), state_aliases(state), group=group)
        except (RuntimeError, ValueError) as e:  # gloo: the peer closed (died) or the send timed out (hung)
            # Under torchrun (a default group exists) torch's c10d logger, failing to name this group (it is not in
            # the world's map), turns gloo's RuntimeError into "ValueError: Process group ... is not initialized
            # in the world group map": the same lost engine.
            raise LinkDown(f"broadcast of version {version} to the engine process failed: {_cause(e)}") from e
