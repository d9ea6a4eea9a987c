"""The engine side of each transport: a receiver, built by the trainer side (``open``), attached to the worker.

A receiver crosses to the engine process with the worker's spec (it is a small frozen value: a
:class:`~satrl.weights.link.Link` at most), is started before the engine is built (``dist`` joins the trainer's
group then, so the first version arrives while the engine loads), attached to the worker once it exists, and
then applies each :mod:`weight message <satrl.weights.messages>` in queue order. What it applies them to is a
:class:`Holder`: the rollout worker (``satrl.pipeline.engines_host.worker.RolloutWorker``), which this layer never imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from satrl.weights.held import Held, InMemory
from satrl.weights.link import Inbox, Link
from satrl.weights.messages import Keep, Load, Put, Take, WeightMessage


class Holder(Protocol):
    """What a receiver drives on the engine side: the versions it holds, and an engine with its own transfer."""

    def put(self, version: int, weights: Held) -> None:
        """Hold the weights of ``version`` until :meth:`keep` no longer lists it."""

    def keep(self, versions: set[int]) -> None:
        """Forget every held version not in ``versions``."""

    def open_transfer(self, link: Link) -> None:
        """The engine's own workers join the trainer's group (``vllm``)."""

    def load_in_engine(self, version: int) -> None:
        """The engine loads ``version`` through its own API (``vllm``); it then holds that one only."""


def _refuse(receiver: object, message: WeightMessage) -> None:
    raise TypeError(f"{type(receiver).__name__} does not take {type(message).__name__} messages (the trainer and "
                    f"the engine side of the weight transport disagree)")  # fmt: skip


@dataclass
class InprocReceiver:
    """``inproc``: the weights arrive in the messages themselves."""

    holder: Holder | None = field(default=None, repr=False)

    def start(self) -> None:
        pass

    def attach(self, holder: Holder) -> None:
        self.holder = holder

    def receive(self, message: WeightMessage) -> None:
        match message:
            case Put(version, weights):
                self.holder.put(version, weights)
            case Keep(versions):
                self.holder.keep(set(versions))
            case _:
                _refuse(self, message)


@dataclass
class BroadcastReceiver:
    """``dist``: the engine process joins the trainer's group at start (:class:`Inbox`, a thread of its own);
    a :class:`Take` hands the version that arrived there to the worker (waiting for it if needed)."""

    link: Link
    holder: Holder | None = field(default=None, repr=False)
    inbox: Inbox | None = field(default=None, repr=False)

    def start(self) -> None:
        self.inbox = Inbox(self.link)

    def attach(self, holder: Holder) -> None:
        self.holder = holder

    def receive(self, message: WeightMessage) -> None:
        match message:
            case Take(version):
                self.holder.put(version, InMemory(self.inbox.take(version)))
            case Keep(versions):
                self.holder.keep(set(versions))
            case _:
                _refuse(self, message)


@dataclass
class EngineReceiver:
    """``vllm``: the engine's own workers join the trainer's group once the engine exists, and a :class:`Load`
    has the engine load that version through its own weight-transfer API."""

    link: Link
    holder: Holder | None = field(default=None, repr=False)

    def start(self) -> None:
        pass

    def attach(self, holder: Holder) -> None:
        self.holder = holder
        holder.open_transfer(self.link)

    def receive(self, message: WeightMessage) -> None:
        match message:
            case Load(version):
                self.holder.load_in_engine(version)
            case Keep(versions):
                self.holder.keep(set(versions))
            case _:
                _refuse(self, message)


Receiver = InprocReceiver | BroadcastReceiver | EngineReceiver

