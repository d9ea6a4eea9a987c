"""The trainer side of each weight transport: what :data:`satrl.weights.transports.TRANSPORTS` builds.

A transport feeds one engine side at a time and mirrors what it holds (the snapshot store's own
:class:`~satrl.weights.snapshot.Snapshot` values, no copy), so that a restarted engine is fed again
(:meth:`TrainerSide.replay`). ``open`` makes the receiver that
goes to the next engine process (:mod:`satrl.weights.receivers`); ``send`` puts one
:mod:`weight message <satrl.weights.messages>` on the request queue, in order among the rollout requests.

Apart from the registry (:mod:`satrl.weights.transports`, which names and declares each transport and imports no
torch, so that a config is checked without it), which imports this module where a transport is built.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from satrl.types import ENGINE_TIMEOUT_S
from satrl.weights import dist as wdist
from satrl.weights.buckets import DEFAULT_BUCKET_BYTES
from satrl.weights.held import Held, InMemory
from satrl.weights.link import LOOPBACK, Link, LinkDown, cause, gloo, serve
from satrl.weights.messages import Keep, Load, Put, Take, WeightMessage
from satrl.weights.receivers import BroadcastReceiver, EngineReceiver, InprocReceiver, Receiver
from satrl.weights.snapshot import Snapshot

Send = Callable[[WeightMessage], None]


class TrainerSide(Protocol):
    """What a backend uses of a transport. ``held``: the versions the engine side holds (version -> its weights, as
    the snapshot store keeps them)."""

    held: dict[int, Snapshot]

    def open(self, alive: Callable[[], bool]) -> Receiver:
        """The receiver for the next engine process (``alive``: whether that process still runs)."""

    def push(self, version: int, weights: Snapshot) -> None: ...

    def keep(self, versions: set[int]) -> None: ...

    def replay(self, versions: list[int]) -> None:
        """Feed a fresh engine these held versions again, in order."""

    def close(self) -> None: ...


class InprocTransport:
    """``inproc``: each version's state dict in one :class:`Put` message (a call in this process on the
    ``sequential`` backend, one pickled message on the ``local`` backend's queue). ``stash`` is how the message
    carries it: the state dict itself (:class:`~satrl.weights.held.InMemory`), or, on the ``ray`` backend, a ref
    into Ray's object store (:func:`~satrl.weights.held.in_object_store`), put there once per version. The state
    dict is the snapshot's own (:meth:`~satrl.weights.snapshot.Snapshot.state`: the trainer's fp32 copy, since
    ``inproc`` declares ``full_snapshots``)."""

    def __init__(self, send: Send, stash: Callable[[dict[str, torch.Tensor]], Held] = InMemory) -> None:
        self.send, self.stash = send, stash
        self.held: dict[int, Snapshot] = {}

    def open(self, alive: Callable[[], bool]) -> InprocReceiver:
        return InprocReceiver()

    def push(self, version: int, weights: Snapshot) -> None:
        self.held[version] = weights
        self.send(Put(version, self.stash(weights.state())))

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self.send(Keep(tuple(sorted(versions))))

    def replay(self, versions: list[int]) -> None:
        for v in versions:
            self.send(Put(v, self.stash(self.held[v].state())))

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Broadcast:
    """Where a broadcast version goes on the engine side: the receiver that takes it, and the message that tells
    it to (``dist``: the engine process's inbox and :class:`Take`; ``vllm``: vLLM's workers and :class:`Load`)."""

    receiver: Callable[[Link], Receiver]
    announce: Callable[[int], WeightMessage]


TO_ENGINE_PROCESS = Broadcast(BroadcastReceiver, Take)  # dist
TO_ENGINE_API = Broadcast(EngineReceiver, Load)  # vllm


class DistTransport:
    """``dist`` and ``vllm``: the trainer and the engine side form a two-process gloo group of their own
    (:class:`~satrl.weights.link.Link`); each version is broadcast once as buckets in the engine's ``dtype``, and
    the queue carries only the message that orders it among keep lists and requests.

    ``wiring`` (:class:`Wiring`) gives the queue's ``send``, the broadcast ``dtype`` and ``bucket_bytes``, and:
    ``timeout_s``: the most seconds a broadcast may wait for the engine (``engine.timeout_s``);
    ``start_timeout_s``: the most a fresh engine may take to join (``engine.start_timeout_s``); ``host``: the one
    address the store and both ranks' gloo listeners bind (the loopback one unless named: nothing is reachable
    from another machine; the link is unauthenticated, see docs/design.md). ``to``: where the engine side loads
    each version (the engine process, or vLLM's own weight-transfer API)."""

    def __init__(self, wiring: Wiring, to: Broadcast = TO_ENGINE_PROCESS) -> None:
        self.send, self.dtype, self.bucket_bytes, self.to = wiring.send, wiring.dtype, wiring.bucket_bytes, to
        self.timeout_s, self.start_timeout_s, self.host = wiring.timeout_s, wiring.start_timeout_s, wiring.host
        self.held: dict[int, Snapshot] = {}
        self.store = serve(self.host, self.start_timeout_s)  # bound to host only (torch binds every interface)
        self._generation = 0
        self._group: dist.ProcessGroup | None = None
        self._join_error: Exception | None = None
        self._joining: threading.Thread | None = None
        self._alive: Callable[[], bool] = lambda: True

    def open(self, alive: Callable[[], bool]) -> Receiver:
        """A fresh group for the next engine process; joined in the background while it starts, and waited for
        at the first push."""
        self._generation += 1
        link = Link(self.store.port, f"engine{self._generation}/", self.host)
        self._group, self._alive, self._join_error = None, alive, None
        self._joining = threading.Thread(target=self._join, args=(link, self._generation), daemon=True)
        self._joining.start()
        return self.to.receiver(link)

    def _join(self, link: Link, generation: int) -> None:
        try:
            group = gloo(dist.PrefixStore(link.prefix, self.store), 0, link.host, self.start_timeout_s)
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

    def push(self, version: int, weights: Snapshot) -> None:
        self.held[version] = weights
        self._broadcast(version)

    def keep(self, versions: set[int]) -> None:
        self.held = {v: s for v, s in self.held.items() if v in versions}
        self.send(Keep(tuple(sorted(versions))))

    def replay(self, versions: list[int]) -> None:
        for v in versions:
            self._broadcast(v)

    def _broadcast(self, version: int) -> None:
        group = self._connected()
        self.send(self.to.announce(version))  # orders the version among keep lists and requests on the queue
        try:  # the kept buckets as they are (the trainer's, in the engine's dtype), or cut from a kept fp32 copy
            stream, tied = self.held[version].stream(self.dtype, self.bucket_bytes)
            wdist.send(version, stream, tied, group=group)
        except (RuntimeError, ValueError) as e:  # gloo: the peer closed (died) or the send timed out (hung)
            # Under torchrun (a default group exists) torch's c10d logger, failing to name this group (it is not in
            # the world's map), turns gloo's RuntimeError into "ValueError: Process group ... is not initialized
            # in the world group map": the same lost engine.
            raise LinkDown(f"broadcast of version {version} to the engine process failed: {cause(e)}") from e


@dataclass(frozen=True)
class Wiring:
    """What a backend knows when it builds a transport's trainer side (:class:`DistTransport` takes it whole)."""

    send: Send
    dtype: torch.dtype  # the engine's weight dtype: it rounds to it anyway, so broadcast no more bytes
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = ENGINE_TIMEOUT_S
    start_timeout_s: float = ENGINE_TIMEOUT_S
    host: str = LOOPBACK  # dist, vllm: the address the link listens on (no config field names another yet)
    # inproc: how a Put carries a version on this backend's channel (in memory; ray: a ref into its object store)
    stash: Callable[[dict[str, torch.Tensor]], Held] = InMemory
