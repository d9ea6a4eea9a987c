"""lag.on_stale: hold generation back for fresher weights instead of dropping stale samples (issue 28, step 4)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from run_helpers import TINY, read_jsonl, stable
from satrl.config import ConfigError, load_config
from satrl.loop.orchestrator import train
from satrl.pipeline.schedules import make_schedule
from satrl.rundir.files import RunDir

ASYNC = ["lag.schedule=async", "lag.max_staleness=2", "seed=5"]  # S = 2 (TINY): lags up to k + S before any drop


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(["sync", "broadcast", "fixed", "async"]),
    S=st.integers(1, 5),
    n=st.integers(0, 12),
    extra=st.integers(0, 8),
    seed=st.integers(0, 1000),
)
def test_hold_bounds_every_lag_and_never_drops(name, S, n, extra, seed):
    k = S - 1 + extra
    held, base = make_schedule(name, S, n, k, seed, on_stale="hold"), make_schedule(name, S, n, k, seed)
    for b in range(30):
        for g in range(4):
            v = held.version(b, g)
            assert base.version(b, g) <= v <= b * S, "never older than the schedule's pick, never from the future"
            assert b * S + S - 1 - v <= k, "lag at the batch's last optimizer step within max_staleness"
            assert not held.drop(b * S + S - 1 - v)
            assert held.held(b, g) == (v != base.version(b, g))
    assert held.max_lag <= k


def test_drop_is_the_default_and_unchanged():
    a, b = make_schedule("async", 2, 1, 3, 7), make_schedule("async", 2, 1, 3, 7, on_stale="drop")
    assert all(a.version(i, g) == b.version(i, g) for i in range(40) for g in range(8))
    assert not any(b.held(i, g) for i in range(40) for g in range(8))
    assert load_config(None, []).lag.on_stale == "drop"


def test_hold_needs_room_for_a_batch_to_age():
    with pytest.raises(ConfigError, match=r"lag.max_staleness=0: lag.on_stale=hold needs at least 1"):
        make_schedule("async", 2, 1, 0, 0, on_stale="hold")
    with pytest.raises(ConfigError, match="lag.on_stale"):
        load_config(None, ["lag.on_stale=wait"])


def _run(tmp_path, name, *overrides):
    out = tmp_path / name
    train(load_config(None, [*TINY, *ASYNC, "steps=10", *overrides, f"out={out}"]))
    return out, read_jsonl(out / "metrics.jsonl")


def test_hold_drops_nothing_and_bounds_the_realized_lag(tmp_path):
    _, dropped = _run(tmp_path, "drop")
    _, held = _run(tmp_path, "hold", "lag.on_stale=hold")
    assert sum(r["async/dropped"] for r in dropped) > 0, "the config must be one where drop drops"
    assert all(r["async/held"] == 0 for r in dropped)
    assert all(r["async/dropped"] == 0 for r in held)
    assert sum(r["async/held"] for r in held) > 0
    assert max(r["lag/max"] for r in held) <= 2  # lag.max_staleness, at every optimizer step
    assert len(held) == 10


def test_hold_concurrent_equals_sequential_replay(tmp_path):
    _, sequential = _run(tmp_path, "sequential", "lag.on_stale=hold")
    _, local = _run(tmp_path, "local", "lag.on_stale=hold", "backend=local")
    assert stable(local) == stable(sequential)


def test_hold_resumes_exactly(tmp_path):
    _, reference = _run(tmp_path, "reference", "lag.on_stale=hold")
    out, _ = _run(tmp_path, "extended", "lag.on_stale=hold", "steps=4")
    train(RunDir.config_of(out, ["steps=10"]), resume=True)
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(reference)
