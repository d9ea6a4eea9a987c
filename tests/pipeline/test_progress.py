"""Run progress: a rich bar on a terminal, plain periodic lines anywhere else, third-party bars off."""

from __future__ import annotations

import io

import pytest

from satrl.config import load_config
from satrl.pipeline import progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


ROW = {"train/reward": 0.5, "lag/mean": 2.0, "mismatch/d_pi": 0.0123, "obj/gate_rate": 0.25}


def _log(total: int, steps, every=None, seconds=60.0, dt=1.0) -> list[str]:
    clock, stream = Clock(), io.StringIO()
    log = progress.LineLog("runs/x", total, stream, every=every, seconds=seconds, clock=clock)
    for step in steps:
        clock.t += dt
        log(step, ROW, {"avg_at_k": 0.7, "test_avg_at_k": 0.75} if step == 3 else None)
    return stream.getvalue().splitlines()


def test_lines_every_tenth_of_the_steps_and_at_the_last():
    lines = _log(25, range(1, 26))  # every 25 // 10 = 2 steps, and step 25
    assert [int(x.split(" step ")[1].split("/")[0]) for x in lines] == [*range(2, 25, 2), 25]
    assert lines[0] == (
        "runs/x step 2/25 (8%) 0:00:02 eta 0:00:23 reward 0.500 eval - lag 2.0 d_pi 0.0123 gate 0.250"
    )
    assert " eval 0.750 " in lines[1]  # the latest eval is kept until the next one


def test_a_line_after_seconds_without_one():
    lines = _log(1000, range(1, 6), seconds=2.5, dt=1.0)  # every 100 steps, but 2.5 s elapse at step 3
    assert [x.split()[2] for x in lines] == ["3/1000"]


def test_resumed_run_eta_counts_only_this_process_steps():
    lines = _log(20, range(11, 21), every=5, dt=2.0)  # 2 s per step from step 11
    assert lines[0].startswith("runs/x step 15/20 (75%) 0:00:10 eta 0:00:10 ")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream_cls,bar", [(io.StringIO, False), (FakeTTY, True)])
def test_bar_only_on_a_terminal(monkeypatch, stream_cls, bar):
    from transformers.utils import logging as hf_logging

    seen = {}

    def fake_train(cfg, resume=False, on_step=None):
        seen["quiet"] = not hf_logging.is_progress_bar_enabled()
        for step in range(1, cfg.steps + 1):
            on_step(step, ROW, None)
        return {}

    monkeypatch.setattr(progress, "train", fake_train)
    hf_logging.enable_progress_bar()
    stream = stream_cls()
    progress.train_with_progress(load_config(None, ["steps=4"]), stream=stream)
    text = stream.getvalue()
    assert seen["quiet"] and hf_logging.is_progress_bar_enabled()  # off during the run, restored after
    assert ("━" in text) is bar and ("step 4/4 (100%)" in text) is not bar
    assert "gate 0.250" in text
