"""A fault at the N-th rollout models a crash in that rollout, not in the delivery of the N-1 before it. The
engine process sends results from a thread; a SIGKILL right after a result was queued used to beat that thread
(CI, 2026-12-03: ``test_dp_run_with_dist_transport_survives_engine_faults[SIGKILL]`` saw every restarted engine
lose its first batch as well, and gave up). Here the sender is made slow on purpose, so the race is certain."""

import multiprocessing as mp
import os
import signal
import time

import pytest

from satrl import faults
from satrl.pipeline.engines_host.engine_process import sender_thread as _sender


class _SlowConnection:
    def __init__(self, conn) -> None:
        self.conn = conn

    def send_bytes(self, data: bytes) -> None:
        time.sleep(0.5)  # the fault fires long before this returns, unless it waits for it
        self.conn.send_bytes(data)


def _child(conn) -> None:
    outbox, _ = _sender(_SlowConnection(conn))
    outbox.put(b"batch 0")
    faults.point("worker.rollout")  # SATRL_FAULT=worker.rollout: SIGKILL here
    conn.send_bytes(b"not killed")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_killed_engine_delivers_the_results_it_queued_first(monkeypatch):
    monkeypatch.setenv("SATRL_FAULT", "worker.rollout")
    ctx = mp.get_context("fork")  # the child needs no pickling: it only runs a queue, a thread and the fault
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child_end,))
    proc.start()
    child_end.close()
    got = []
    while True:
        try:
            got.append(parent_end.recv_bytes())
        except EOFError:
            break
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    assert got == [b"batch 0"]


def test_kill_hooks_run_before_the_signal(monkeypatch):
    """``on_kill`` hooks run in order, before the fault's signal (here a harmless one with a handler)."""
    seen: list[str] = []
    monkeypatch.setattr(faults, "_before_kill", [lambda: seen.append("hook")])
    monkeypatch.setattr(faults, "_counts", {})
    monkeypatch.setenv("SATRL_FAULT", "x.point:2")
    monkeypatch.setenv("SATRL_FAULT_SIGNAL", "SIGUSR1")
    old = signal.signal(signal.SIGUSR1, lambda *_: seen.append("signal"))
    try:
        faults.point("x.point")
        assert seen == []  # the first time: not yet
        faults.point("x.point", before=lambda: seen.append("before"))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen == ["hook", "before", "signal"]


def test_several_signals_go_one_per_child(monkeypatch):
    """``SATRL_FAULT_SIGNAL=A,B``: a process fires the first; each ``spawned`` (a parent that started a child with
    the list as it was) moves the list on, the last signal staying."""
    seen: list[str] = []
    monkeypatch.setattr(faults, "_before_kill", [])
    monkeypatch.setattr(faults, "_counts", {})
    monkeypatch.setenv("SATRL_FAULT", "x.point")
    monkeypatch.setenv("SATRL_FAULT_SIGNAL", "SIGUSR1,SIGUSR2")
    old = {s: signal.signal(s, lambda n, _: seen.append(signal.Signals(n).name)) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        faults.point("x.point")
        for _ in range(2):
            faults.spawned()
            assert os.environ["SATRL_FAULT_SIGNAL"] == "SIGUSR2"
            monkeypatch.setattr(faults, "_counts", {})  # as in a new process
            faults.point("x.point")
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    assert seen == ["SIGUSR1", "SIGUSR2", "SIGUSR2"]


def test_none_is_no_fault_for_the_children_after_the_first(monkeypatch):
    """``SATRL_FAULT_SIGNAL=SIGUSR1,none``: the first process fires, the children started after it reach the point
    and go on (tests/run_helpers.fault_first_engine: a faulted engine whose replacements run clean)."""
    seen: list[str] = []
    monkeypatch.setattr(faults, "_before_kill", [lambda: seen.append("hook")])
    monkeypatch.setattr(faults, "_counts", {})
    monkeypatch.setenv("SATRL_FAULT", "x.point")
    monkeypatch.setenv("SATRL_FAULT_SIGNAL", "SIGUSR1,none")
    old = signal.signal(signal.SIGUSR1, lambda n, _: seen.append("SIGUSR1"))
    try:
        faults.point("x.point")
        for _ in range(2):
            faults.spawned()
            monkeypatch.setattr(faults, "_counts", {})  # as in a new process
            faults.point("x.point")
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen == ["hook", "SIGUSR1"] and os.environ["SATRL_FAULT_SIGNAL"] == "none"
