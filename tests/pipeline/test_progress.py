"""Run progress: a rich bar on a terminal, plain periodic lines anywhere else, third-party bars off."""

from __future__ import annotations

import io

import pytest

from satrl.config import load_config
from satrl.loop import progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


ROW = {"train/reward": 0.5, "lag/mean": 2.0, "mismatch/d_pi": 0.0123, "obj/gate_rate": 0.25}


def _log(total: int, steps, every=None, seconds=60.0, dt=1.0) -> list[str]:
    clock, stream = Clock(), io.StringIO()
    log = progress.LineLog("runs/x", total, stream, progress.Cadence(every, seconds), clock=clock)
    for step in steps:
        clock.t += dt
        log(step, ROW, {"avg_at_k": 0.7, "test_avg_at_k": 0.75} if step == 3 else None)
    return stream.getvalue().splitlines()


def test_lines_every_tenth_of_the_steps_and_at_the_last():
    lines = _log(25, range(1, 26))  # every 25 // 10 = 2 steps, and step 25
    assert [int(x.split(" step ")[1].split("/")[0]) for x in lines] == [*range(2, 25, 2), 25]
    assert lines[0] == (
        "runs/x step 2/25 (8%) 0:00:02 eta ? reward 0.500 eval - lag 2.0 d_pi 0.0123 gate 0.250"
    )  # one interval, the warm-up: no rate yet
    assert " eta 0:00:21 " in lines[1]  # step 4: two steps timed at 1 s, 21 left
    assert " eval 0.750 " in lines[1]  # the latest eval is kept until the next one


def test_a_slow_first_step_does_not_inflate_the_eta():
    """The pipeline's first step took 30 s (the engine's first batches), every later one 1 s: once two steps are
    timed the eta is the steps left at 1 s, not at the mean with the warm-up in it (issue 47's probe: 3x)."""
    clock, stream = Clock(), io.StringIO()
    log = progress.LineLog("runs/x", 50, stream, progress.Cadence(every=1), clock=clock)
    for step, dt in ((1, 5.0), (2, 30.0), (3, 1.0), (4, 1.0)):
        clock.t += dt
        log(step, ROW, None)
    eta = [x.split(" eta ")[1].split()[0] for x in stream.getvalue().splitlines()]
    assert eta == ["?", "?", "?", "0:00:46"]


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

    def fake_train(cfg, resume=False, on_step=None, ctx=None):
        seen["quiet"] = not hf_logging.is_progress_bar_enabled()
        for step in range(1, cfg.steps + 1):
            on_step(step, ROW, None)
        return {}

    monkeypatch.setattr(progress, "train", fake_train)
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for every metric (a narrow bar cuts them first)
    hf_logging.enable_progress_bar()
    stream = stream_cls()
    progress.train_with_progress(load_config(None, ["steps=4"]), stream=stream)
    text = stream.getvalue()
    assert seen["quiet"] and hf_logging.is_progress_bar_enabled()  # off during the run, restored after
    assert ("━" in text) is bar and ("step 4/4 (100%)" in text) is not bar
    assert "gate 0.250" in text


def test_percentage_is_rounded_share_of_steps_done():
    lines = _log(6, range(1, 7), every=1)
    assert [x.split()[3] for x in lines] == ["(17%)", "(33%)", "(50%)", "(67%)", "(83%)", "(100%)"]


def test_eta_leaves_out_start_up_and_counts_the_evals_still_due():
    """Start-up (imports, model, the step-0 eval) took 100 s; each step takes 1 s and each eval 5 s more. The
    first line's eta is the steps left at 1 s (no eval seen yet: `?` before any step); once an eval has been
    seen, the evals still due (every 10 steps and the last) are added at its cost."""
    clock, stream = Clock(), io.StringIO()
    log = progress.LineLog("runs/x", 30, stream, progress.Cadence(every=5), clock=clock, eval_every=10)
    clock.t = 100.0
    for step in range(1, 31):
        clock.t += 1.0 + (5.0 if step % 10 == 0 else 0.0)
        log(step, ROW, {"test_avg_at_k": 0.5} if step % 10 == 0 else None)
    lines = stream.getvalue().splitlines()
    eta = {int(x.split()[2].split("/")[0]): x.split(" eta ")[1].split()[0] for x in lines}
    assert eta[5] == "0:00:25"  # 25 steps x 1 s; evals not seen yet
    assert eta[15] == "0:00:25"  # 15 steps x 1 s + 2 evals (20, 30) x 5 s
    assert eta[30] == "0:00:00"
    assert log.evals_left(0) == 3 and log.evals_left(29) == 1 and log.evals_left(30) == 0
    late = progress.LineLog("x", 25, io.StringIO(), eval_every=10)
    assert late.evals_left(0) == 3 and late.evals_left(20) == 1  # 10, 20 and the last step (25)
    assert progress.LineLog("x", 25, io.StringIO(), eval_every=0).evals_left(3) == 1
