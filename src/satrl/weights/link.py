"""The trainer-engine link of the ``dist`` and ``vllm`` transports: a two-process gloo group of their own.

The trainer owns a TCPStore; each engine process gets a key prefix of its own (:class:`Link`), so a restarted
engine joins a fresh group. The engine side receives every broadcast version on a thread of its own
(:class:`Inbox`), so the trainer's push never waits for a generation. The wire is :mod:`satrl.weights.dist`:
raw bytes and JSON headers, nothing pickled.

Every socket the link listens on is bound to one address, the loopback one (:data:`LOOPBACK`) unless a caller
names another: the store's (:func:`serve`: bound here, as torch's TCPStore server binds the wildcard address
whatever host it is given) and each rank's gloo pair listener (:func:`gloo`: a device created for that address).
The link is unauthenticated (docs/design.md, "Weights travel once per version").
"""

from __future__ import annotations

import datetime
import socket
import threading
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from satrl.weights import dist as wdist

LOOPBACK = "127.0.0.1"  # the engine process is on this machine (the dist transport is backend=local only)


class LinkDown(RuntimeError):
    """The engine process did not join its group, or a broadcast to it failed (it died or hung): the backend
    restarts it, and the restart feeds the fresh one every held version again."""


@dataclass(frozen=True)
class Link:
    """Where an engine process joins the trainer's group: the trainer's TCPStore and this process's key prefix."""

    port: int
    prefix: str
    host: str = LOOPBACK


def serve(host: str, timeout_s: float) -> dist.TCPStore:
    """Trainer: the link's TCPStore server, listening on ``host`` only (a port the OS picks: ``.port``).

    torch's TCPStore server binds the wildcard address (``*:PORT``, every interface) whatever ``host`` says, so
    the socket is bound here and handed over as ``master_listen_fd``; the store owns (and closes) it from then on.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    return dist.TCPStore(host, port, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=sock.detach(), use_libuv=True)  # fmt: skip


def gloo(store, rank: int, host: str, timeout_s: float) -> dist.ProcessGroup:
    """A two-rank gloo group on ``store``, outside torch's default group (a torchrun trainer already has one).
    gloo's device is created for ``host``, so each rank's pair listener binds that address (the loopback one by
    default: the engine process is on this machine), never the wildcard; ``GLOO_SOCKET_IFNAME`` plays no part."""
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(store, rank, 2, opts)


def join(link: Link, timeout_s: float = 7 * 86400.0) -> dist.ProcessGroup:
    """Engine process: join the trainer's group as rank 1. The long timeout is the wait for the next version,
    which lasts as long as the trainer trains (the trainer's side has the short one: ``engine.timeout_s``)."""
    store = dist.TCPStore(link.host, link.port, None, False, datetime.timedelta(seconds=timeout_s))
    return gloo(dist.PrefixStore(link.prefix, store), 1, link.host, timeout_s)


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


def cause(e: BaseException) -> str:
    """The first line of the innermost error behind ``e`` (gloo's, not the logger's that replaced it)."""
    while e.__context__ is not None and e.__cause__ is None and isinstance(e, ValueError):
        e = e.__context__
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
