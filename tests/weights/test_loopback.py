"""The `dist` weight link listens on the loopback interface only (issue 46, item 6): the trainer's TCPStore and
both ranks' gloo pair listeners, read from /proc/net/tcp{,6} by the address each LISTEN socket is bound to, for
the trainer process and the engine process it feeds. Traffic goes to 127.0.0.1 only."""

import os
import re
import socket
import struct
import sys

import pytest
import torch

if not sys.platform.startswith("linux"):
    pytest.skip("reads /proc/net/tcp", allow_module_level=True)

WILDCARD = {"0.0.0.0", "::"}


def _address(hex_addr: str) -> tuple[str, int]:
    """(address, port) of a /proc/net/tcp{,6} column: the address as 32-bit words in host order, the port big."""
    addr, port = hex_addr.split(":")
    raw = b"".join(struct.pack("=I", int(addr[i : i + 8], 16)) for i in range(0, len(addr), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


def listening(pid: int | str = "self") -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in state LISTEN (0A) that process ``pid`` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    found.append(_address(cols[1]))
    return found


def _loopback_only(sockets: list[tuple[str, int]]) -> bool:
    return all(a not in WILDCARD and (a.startswith("127.") or a == "::1") for a, _ in sockets)


def test_the_proc_reader_sees_what_torchs_own_server_binds():
    """Why the link binds its own socket: torch's TCPStore server, given 127.0.0.1, listens on every interface
    (the check this file makes catches it)."""
    import datetime

    import torch.distributed as dist

    before = set(listening())
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    try:
        new = [s for s in listening() if s not in before]
        assert any(port == store.port for _, port in new)
        assert not _loopback_only(new)  # *:PORT (:: or 0.0.0.0)
    finally:
        del store


def test_the_store_listens_on_loopback_only():
    from satrl.weights.link import serve

    before = set(listening())
    store = serve("127.0.0.1", 10)
    new = [s for s in listening() if s not in before]
    assert new == [("127.0.0.1", store.port)]
    import datetime

    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", store.port, None, False, datetime.timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"  # it serves on the socket it was handed
    del client, store
    assert set(listening()) == before  # the store owned the socket and closed it


def _engine(link, out, done) -> None:
    """Engine process: join the trainer's group, take version 0, report its own LISTEN sockets, wait."""
    from satrl.weights.link import Inbox

    inbox = Inbox(link)
    state = inbox.take(0)
    out.put((float(state["w"].sum()), listening()))
    done.wait(60)


def test_trainer_and_engine_listen_on_loopback_only():
    """A live link (one version broadcast over it): every LISTEN socket of the trainer process (the store, the
    gloo listener of rank 0) and of the engine process (rank 1's gloo listener) is bound to 127.0.0.1."""
    from satrl.weights.buckets import state_buckets
    from satrl.weights.link import TrainerLink, send

    ctx = torch.multiprocessing.get_context("spawn")
    out, done = ctx.Queue(), ctx.Event()
    before = set(listening())
    trainer = TrainerLink(timeout_s=60, start_timeout_s=60)
    link = trainer.open(lambda: proc.is_alive())
    assert link.host == "127.0.0.1"
    proc = ctx.Process(target=_engine, args=(link, out, done))
    proc.start()
    try:
        send(0, state_buckets({"w": torch.ones(4)}, torch.float32), {}, group=trainer.connected())
        total, engine_sockets = out.get(timeout=60)
        trainer_sockets = [s for s in listening() if s not in before]
        assert total == 4.0
        assert ("127.0.0.1", trainer.store.port) in trainer_sockets
        assert len(trainer_sockets) >= 2, trainer_sockets  # the store and rank 0's gloo listener
        assert engine_sockets, "the engine process holds no listener: gloo's would be one"
        assert _loopback_only(trainer_sockets), trainer_sockets
        assert _loopback_only(engine_sockets), engine_sockets
    finally:
        done.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
