"""benchmarks/real_run.py: the measured run of a real model, recorded from its logs, and the docs that quote it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from benchmarks.real_run import record, row, table, watch

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path) -> Path:
    metrics = [  # cumulative engine seconds 4, 7, 12: a step generated for 4, 3 and 5 s
        {"step": 1, "train/reward": 0.25, "perf/trainer_wait_s": 4.0, "perf/engine_busy_s": 4.0, "train/tokens": 100.0,
         "perf/trainer_tok_s": 50.0, "wall_s": 10.0},
        {"step": 2, "train/reward": 0.5, "perf/trainer_wait_s": 0.0, "perf/engine_busy_s": 7.0, "train/tokens": 90.0,
         "perf/trainer_tok_s": 30.0, "wall_s": 14.0},
        {"step": 3, "train/reward": 0.75, "perf/trainer_wait_s": 1.0, "perf/engine_busy_s": 12.0, "train/tokens": 80.0,
         "perf/trainer_tok_s": 80.0, "wall_s": 120.0},
    ]  # fmt: skip
    evals = [{"step": 0, "test_avg_at_k": 0.125, "test_greedy_acc": 0.25, "test_pass_at_k": 0.5, "val_avg_at_k": 0.9},
             {"step": 3, "test_avg_at_k": 0.375, "test_greedy_acc": 0.5, "test_pass_at_k": 0.75, "val_avg_at_k": 0.9}]  # fmt: skip
    for name, rows in (("metrics.jsonl", metrics), ("eval.jsonl", evals)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_record_splits_each_step_into_generation_and_training(tmp_path):
    rss = {"command": "/some/python -m satrl train", "rc": 0, "wall_s": 130.0, "peak_rss_sum_mb": 4096,
           "peak_rss_process_mb": 3000}  # fmt: skip
    rec = record(_run(tmp_path), "torch", rss)
    assert [s["generate_s"] for s in rec["steps"]] == [4.0, 3.0, 5.0]  # differences of the cumulative busy time
    assert [s["train_s"] for s in rec["steps"]] == [2.0, 3.0, 1.0]  # tokens / tokens per second
    assert (rec["median_generate_s"], rec["median_train_s"]) == (4.0, 2.0)
    assert "val_avg_at_k" not in rec["evals"][0]  # validation picks checkpoints; it is never reported
    assert rec["memory"] == {"rc": 0, "peak_rss_sum_mb": 4096, "peak_rss_process_mb": 3000, "wall_s": 130.0}  # no command
    assert "| 3 | 37.5 % | 50.0 % | 75.0 % |" in table(rec, every=2)
    assert "| 1-2 | 0.375 | 3.5 | 2.5 |" in table(rec, every=2) and "| 3-3 | 0.750 | 5.0 | 1.0 |" in table(rec, every=2)
    assert row(rec) == "| torch | 3 | 12.5 % (step 0) | 4.0 | 2.0 | 130 | 4,096 | 0 |"


def test_a_run_killed_before_its_first_step_keeps_its_evaluation(tmp_path):
    _run(tmp_path)
    (tmp_path / "metrics.jsonl").unlink()
    rec = record(tmp_path, "vllm", {"rc": -9, "wall_s": 50.0, "peak_rss_sum_mb": 15000, "peak_rss_process_mb": 6000})
    assert rec["steps"] == [] and rec["median_train_s"] is None and len(rec["evals"]) == 2
    assert "steps" not in table(rec) and table(rec).startswith("| step | held-out")
    assert row(rec) == "| vllm | 0 | 12.5 % (step 0) | - | - | 50 | 15,000 | -9 |"


def test_watch_sees_the_memory_of_a_child_process():
    grow = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; b = bytearray(300 << 20); time.sleep(3)'])"
    out = watch([sys.executable, "-c", grow], every_s=0.2)
    assert out["rc"] == 0 and out["peak_rss_process_mb"] >= 300  # the grandchild's 300 MB, not the parent's few
    assert out["peak_rss_sum_mb"] >= out["peak_rss_process_mb"] + 5  # the parent counted too


MARK = re.compile(r"<!-- real-run: (\S+) -->")


@pytest.mark.parametrize("doc", ["real-models.md", "benchmarks.md"])
def test_the_docs_quote_the_committed_records(doc):
    """Every measured-run table in the docs is what table() / row() make of its record in docs/results/real_models."""
    text = (REPO / "docs" / doc).read_text()
    names = MARK.findall(text)
    assert sorted(set(names)) == ["smollm2_arith_torch_2steps", "smollm2_arith_torch_30steps", "smollm2_arith_torch_3steps",
                                 "smollm2_arith_torch_base",
                                 "smollm2_arith_vllm_30steps", "smollm2_arith_vllm_base"], doc
    for name in names:
        rec = json.loads((REPO / "docs" / "results" / "real_models" / f"{name}.json").read_text())
        want = table(rec) if doc == "real-models.md" else row(rec)
        after = text.split(f"<!-- real-run: {name} -->", 1)[1]
        assert want in after[: len(want) + 800], f"{doc}: the {name} numbers differ from its record"
