"""benchmarks/trl_side_by_side.py: satrl and TRL's GRPOTrainer on the same work.

The summary and table are checked on runs made up here (hand-worked numbers); the committed record is checked to
be what the docs section prints; and the benchmark's own runs (each row in
its fresh process: satrl lag 0, lag 1, TRL) go once, for 2 steps, on the tiny SmolLM2 of tests/gguf_tiny.py (its architecture, tokenizer kind and chat
template, random weights) with configs/real/smollm2_side_by_side.yaml's task, as the real measurement runs them. Without
TRL that test skips with the reason (and fails under ``SATRL_REQUIRE_TRL=1``, as test_trl.py says)."""

from __future__ import annotations

import json
import os

import pytest
from benchmarks.trl_side_by_side import (
    ROWS,
    SECTION,
    Work,
    measure,
    parse_table,
    rewards,
    steady,
    summarize,
    table,
)

from run_helpers import REPO, Extra

with Extra("TRL") as trl_extra:
    import trl  # noqa: F401
TRL_MISSING = trl_extra.missing
RECORD = REPO / "docs" / "results" / "trl_side_by_side" / "smollm2.json"


def _run(row: str, ends: list[float], cpu: list[float], tokens: list[float], wall: float = 100.0) -> dict:
    return {"row": row, "step_end_s": ends, "cpu_s": cpu, "response_tokens": tokens, "reward": [0.0] * len(ends),
            "run_wall_s": wall, "run_cpu_s": 2 * wall, "gen_wait_s": [1.0] * len(ends), "train_s": [1.0] * len(ends)}  # fmt: skip


def test_steady_rates_drop_the_first_step():
    r = _run("trl", [50.0, 60.0, 74.0], [30.0, 45.0, 61.0], [999.0, 40.0, 44.0])
    assert steady(r) == pytest.approx({"s_per_step": 12.0, "cpu_per_step": 15.5, "tok_s": 84 / 24,
                                       "gen_s": 1.0, "train_s": 1.0})  # fmt: skip
    with pytest.raises(ValueError, match="at least 2"):
        steady(_run("trl", [50.0], [1.0], [1.0]))


def test_table_prints_medians_ranges_and_the_ratio_to_trl():
    runs = [_run("trl", [0, 10], [0, 10], [0, 20]), _run("trl", [0, 20], [0, 10], [0, 20]),
            _run("trl", [0, 40], [0, 10], [0, 20]), _run("satrl-lag0", [0, 4], [0, 5], [0, 20]),
            _run("satrl-lag0", [0, 5], [0, 5], [0, 20]), _run("satrl-lag0", [0, 10], [0, 5], [0, 20])]  # fmt: skip
    summary = summarize(runs)
    assert list(summary) == ["satrl-lag0", "trl"]
    assert summary["trl"]["tok_s"] == {"median": 1.0, "min": 0.5, "max": 2.0, "n": 3}
    assert summary["satrl-lag0"]["vs_trl"] == pytest.approx(4.0)  # median 4 tok/s over TRL's 1
    text = table(summary)
    assert "| satrl-lag0 | 5.00 (4.00-10.00) |" in text and "| 4.0 (2.0-5.0) |" in text
    parsed = parse_table(text)
    assert parsed["satrl-lag0"]["tok/s vs TRL"] == 4.0 and parsed["trl"]["wall s/step"] == 20.0
    assert "satrl-lag0 #3: 0.000 0.000" in rewards(summary)


def test_the_committed_section_is_its_record():
    """docs/benchmarks.md's section prints what summarize() and table() make of the committed runs."""
    record = json.loads(RECORD.read_text())
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    section = doc.split(f"<!-- BEGIN {SECTION} -->")[1].split(f"<!-- END {SECTION} -->")[0]
    summary = summarize(record["runs"])
    assert table(summary) in section and record["command"] in section
    assert {r["row"] for r in record["runs"]} == set(ROWS)


@pytest.mark.slow
@pytest.mark.skipif(TRL_MISSING is not None and os.environ.get("SATRL_REQUIRE_TRL") != "1", reason=str(TRL_MISSING))
def test_each_side_trains_the_same_work_on_a_tiny_smollm2(tmp_path):
    from gguf_tiny import write_tiny_gguf
    from satrl.models.gguf import convert_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    work = Work(str(tmp_path / "hf"), steps=2, prompts=2, group=2, tokens=4)
    runs = measure(work, repeats=1, say=lambda _: None, log=tmp_path / "runs.jsonl")
    assert [r["row"] for r in runs] == list(ROWS)
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 3
    for r in runs:  # one entry per step, every response between 1 and max tokens, rewards in [0, 1]
        assert len(r["step_end_s"]) == len(r["reward"]) == len(r["cpu_s"]) == 2, r["row"]
        assert all(4 <= n <= 4 * work.tokens for n in r["response_tokens"]), r
        assert all(0 <= x <= 1 for x in r["reward"]) and r["run_cpu_s"] > 0
    parsed = parse_table(table(summarize(runs)))
    assert set(parsed) == set(ROWS) and parsed["trl"]["tok/s vs TRL"] == 1.0
    for row in ROWS:
        assert parsed[row]["response tok/s"] > 0
