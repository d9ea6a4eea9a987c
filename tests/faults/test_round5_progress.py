"""Issue 60: the progress line keeps what matters on a narrow terminal, and a resumed run knows its pace.

At 80 columns the live bar's metrics took the width and the step count, elapsed time and ETA showed as ``…``;
now the metrics are cut first (then the run's name, its end kept). A resumed run's first plain line said
``eta ?``; it now takes the run's earlier pace from its metrics.jsonl until it has timed steps of its own."""

import io
import json
import re

import pytest

from satrl.config import load_config
from satrl.loop import progress

ROW = {"train/reward": 0.512, "lag/mean": 3.5, "mismatch/d_pi": 0.0123, "obj/gate_rate": 0.01}


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _fake_train(first: int):
    def train(cfg, resume=False, on_step=None, ctx=None):
        for step in range(first, cfg.steps + 1):
            on_step(step, ROW, {"test_avg_at_k": 0.43} if step == first else None)
        return {}

    return train


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_bar_keeps_step_elapsed_and_eta(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(progress, "train", _fake_train(1))
    stream = FakeTTY()
    progress.train_with_progress(load_config(None, ["steps=400", "out=runs/sat_grpo-broadcast-n8-s0"]),
                                 stream=stream)  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", stream.getvalue()).replace("\r", "\n")
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert len(last) <= columns, last
    assert re.search(r" 400/400 \d+:\d\d:\d\d \d+:\d\d:\d\d ", last), last  # step, elapsed, eta: whole
    assert "reward" in last and "n8-s0" in last, last  # the metrics cut, not dropped; the name's end kept


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_fitted_takes_room_from_the_metrics_first(columns):
    name, info = "runs/sat_grpo-broadcast-n8-s0", progress.step_info(ROW, {"test_avg_at_k": 0.43})
    shown, bar, cut = progress.fitted(columns, name, 400, info)
    assert len(shown) + bar + len(cut) + 7 + 7 + 7 + 5 <= columns
    if columns == 200:
        assert (shown, cut) == (name, info)
    elif cut != info:
        assert cut.endswith("…") and info.startswith(cut[:-1])


def test_resumed_run_first_plain_line_has_an_eta(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    rows = [
        {"step": s, "wall_s": 30.0 + 2.0 * s + (9.0 if s == 5 else 0.0)} for s in range(1, 11)
    ]  # 2 s a step
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert progress.prior_step_s(out / "metrics.jsonl") == 2.0  # the median: step 5's extra 9 s left out
    monkeypatch.setattr(progress, "train", _fake_train(11))
    stream = io.StringIO()
    progress.train_with_progress(load_config(None, ["steps=20", f"out={out}"]), resume=True, stream=stream)
    first = stream.getvalue().splitlines()[0]
    assert first.startswith(f"{out} step 12/20 (60%) ") and " eta 0:00:16 " in first, first  # 8 steps x 2 s


def test_fresh_run_without_a_pace_still_says_it_does_not_know(tmp_path):
    assert progress.prior_step_s(tmp_path / "missing.jsonl") is None
