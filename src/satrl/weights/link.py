"""The trainer-engine link of the ``dist`` and ``vllm`` transports: a two-process gloo group of their own, and
the wire a version travels on.

The trainer owns a TCPStore (:class:`TrainerLink`); each engine process gets a key prefix of its own
(:class:`Link`), so a restarted engine joins a fresh group. The engine side receives every broadcast version on a
thread of its own (:class:`Inbox`), so the trainer's push never waits for a generation.

The wire (:func:`send`, :func:`receive`), per version, all broadcasts from ``src``: for each bucket
(:mod:`satrl.weights.buckets`) a header (JSON, sent as its length then its UTF-8 bytes) and the bucket's flat
tensor as raw bytes (so any dtype travels, bf16 included, bit for bit); then a closing header
``{"version": v, "aliases": {...}}``. Nothing is pickled. ``src`` is a rank *within* ``group``
(``group_src``), so a standalone two-process group works as well as a subgroup of a torchrun job. gloo on CPU,
NCCL on GPU.

Every socket the link listens on is bound to one address, the loopback one (:data:`LOOPBACK`) unless a caller
names another: the store's (:func:`serve`: bound here, as torch's TCPStore server binds the wildcard address
whatever host it is given) and each rank's gloo pair listener (:func:`gloo`: a device created for that address).
The link is unauthenticated (docs/design.md, "Weights travel once per version").
"""

from __future__ import annotations

import datetime
import json
import math
import socket
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from satrl.dtypes import named_dtype
from satrl.weights.buckets import Bucket, unpack

LOOPBACK = "127.0.0.1"  # the engine process is on this machine (the dist transport is backend=local only)

# The engine process did not join its group, or a broadcast to it failed (it died or hung): the backend restarts
# it, and the restart feeds the fresh one every held version again. A builtin: nothing but its name to carry.
LinkDown = ConnectionError


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
                version, state = receive(0, group)
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


class TrainerLink:
    """Trainer: the store every engine process's group meets at, and the group of the engine process now running.

    :meth:`open` gives each new engine process a fresh :class:`Link` and joins its group in the background while
    the engine starts; :meth:`connected` waits for that join (the first broadcast calls it). ``timeout_s``: the
    most seconds a broadcast may wait for the engine (``engine.timeout_s``); ``start_timeout_s``: the most a fresh
    engine may take to join (``engine.start_timeout_s``); ``host``: the one address the store and both ranks' gloo
    listeners bind (nothing is reachable from another machine; the link is unauthenticated)."""

    def __init__(self, timeout_s: float, start_timeout_s: float, host: str = LOOPBACK) -> None:
        self.timeout_s, self.start_timeout_s, self.host = timeout_s, start_timeout_s, host
        self.store = serve(host, start_timeout_s)  # bound to host only (torch binds every interface)
        self._generation = 0
        self._group: dist.ProcessGroup | None = None
        self._join_error: Exception | None = None
        self._joining: threading.Thread | None = None
        self._alive: Callable[[], bool] = lambda: True

    def open(self, alive: Callable[[], bool]) -> Link:
        """Where the next engine process joins (``alive``: whether it still runs); joined in the background."""
        self._generation += 1
        link = Link(self.store.port, f"engine{self._generation}/", self.host)
        self._group, self._alive, self._join_error = None, alive, None
        self._joining = threading.Thread(target=self._join, args=(link, self._generation), daemon=True)
        self._joining.start()
        return link

    def _join(self, link: Link, generation: int) -> None:
        try:
            group = gloo(dist.PrefixStore(link.prefix, self.store), 0, link.host, self.start_timeout_s)
            group.set_timeout(datetime.timedelta(seconds=self.timeout_s))  # joined: now the hang deadline
        except Exception as e:  # noqa: BLE001 - reported by the broadcast that waits for it
            group, error = None, e
        else:
            error = None
        if generation == self._generation:  # a replaced engine's late join must not overwrite its successor's
            self._group, self._join_error = group, error

    def connected(self) -> dist.ProcessGroup:
        """The engine process's group, once it joined; :data:`LinkDown` if it exited or failed to."""
        while self._joining is not None and self._joining.is_alive():
            self._joining.join(0.5)
            if not self._alive():
                raise LinkDown("the engine process exited before joining the trainer's group")
        if self._group is None:
            raise LinkDown(f"the engine process did not join the trainer's group: {self._join_error}")
        return self._group

    def close(self) -> None:
        self._group = None  # the engine process is gone; its group with it


def cause(e: BaseException) -> str:
    """The first line of the innermost error behind ``e`` (gloo's, not the logger's that replaced it)."""
    while e.__context__ is not None and e.__cause__ is None and isinstance(e, ValueError):
        e = e.__context__
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _backend(group) -> str:
    """The group's backend name; a standalone group (a ``ProcessGroupGloo`` built on its own store, as the local
    backend's trainer-engine link is) is not in torch's registry of groups, and names itself."""
    try:
        return dist.get_backend(group)
    except ValueError:  # "not initialized in the world group map"
        if group is None:
            raise
        return group.name()


def _device(group) -> torch.device:
    """Where collectives of this group must put their tensors: the current GPU under NCCL, else the CPU."""
    if _backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _send_json(obj: dict, src: int, group) -> None:
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    dev = _device(group)
    dist.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=dev), group=group, group_src=src)
    dist.broadcast(data.to(dev), group=group, group_src=src)


def _recv_json(src: int, group) -> dict:
    dev = _device(group)
    n = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.broadcast(n, group=group, group_src=src)
    data = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    dist.broadcast(data, group=group, group_src=src)
    return json.loads(data.cpu().numpy().tobytes().decode())


def send(version: int, stream: Iterable[Bucket], tied: dict[str, str], src: int = 0, group=None) -> int:
    """Broadcast one version's buckets (on the sending rank); returns the bytes sent. Holds one bucket at a
    time: the stream gathers the next only after this one is on the wire."""
    sent = 0
    dev = _device(group)
    for bucket in stream:
        _send_json({"bucket": bucket.header()}, src, group)
        dist.broadcast(bucket.flat.view(torch.uint8).to(dev), group=group, group_src=src)
        sent += bucket.flat.numel() * bucket.flat.element_size()
    _send_json({"version": version, "aliases": tied}, src, group)
    return sent


def receive(src: int = 0, group=None) -> tuple[int, dict[str, torch.Tensor]]:
    """(version, full state dict on the CPU) of the next version broadcast by ``src`` (on a receiving rank)."""
    got: list[Bucket] = []
    dev = _device(group)
    while True:
        msg = _recv_json(src, group)
        if "version" in msg:
            return int(msg["version"]), unpack(got, msg["aliases"])
        h = msg["bucket"]
        shapes = tuple(tuple(s) for s in h["shapes"])
        numel = sum(math.prod(s) for s in shapes)
        dtype = named_dtype(h["dtype"])
        raw = torch.empty(numel * dtype.itemsize, dtype=torch.uint8, device=dev)
        dist.broadcast(raw, group=group, group_src=src)
        got.append(Bucket(tuple(h["names"]), shapes, raw.cpu().view(dtype)))
