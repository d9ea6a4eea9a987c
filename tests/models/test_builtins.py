"""The shipped base policies: they load, record how to regenerate them, and score in the base band.

The band is avg@8 (temperature 1, eval split) in [0.2, 0.6] for the arithmetic bases (DESIGN/issue 3) and in
[0.15, 0.40] for countdown_trace's (issue 49: room to learn). The score here uses 50 eval problems x 8 samples
through the same evaluate() and torch engine as `satrl eval`, on the task each base was pretrained on (its
pretrain.json), with that task's response cap, so it is a noisy estimate of the recorded one.
"""

from __future__ import annotations

import json

import pytest

from satrl.engines import EngineSpec, TorchEngine
from satrl.models import BUILTINS, builtin_path, count_params, load_policy
from satrl.tasks import make_task
from satrl.tasks.evaluate import evaluate
from satrl.types import SamplingParams

BANDS = {"arithmetic": (0.2, 0.6), "countdown_trace": (0.15, 0.40)}


def _task_of(record: dict):
    args = record["args"]
    if args["task"] == "arithmetic":
        return make_task("arithmetic", digits=args["digits"], ops=args["ops"])
    return make_task(args["task"])


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_shipped_files_and_record(name):
    path = builtin_path(name)
    assert (path / "model.safetensors").stat().st_size <= 10 * 2**20
    record = json.loads((path / "pretrain.json").read_text())
    cmd = record["command"]
    assert cmd.startswith(f"satrl pretrain --model {name} --steps {record['steps_run']} --seed 0 ")
    assert record["args"]["steps"] == record["steps_run"]
    low, high = BANDS[record["args"]["task"]]
    assert low <= record["final"]["avg_at_k"] <= high
    model, _ = load_policy(name)
    assert count_params(model) == record["params"]


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_shipped_policy_scores_in_band(name):
    model, tok = load_policy(name)
    engine = TorchEngine(model, EngineSpec(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tokenizer=tok, numerics="fp32"))  # fmt: skip
    record = json.loads((builtin_path(name) / "pretrain.json").read_text())
    task = _task_of(record)
    cap = getattr(task, "max_new_tokens", None)
    sampling = SamplingParams(max_new_tokens=cap) if cap is not None else None
    result = evaluate(engine, tok, task, k=8, n_problems=50, seed=1, sampling=sampling)
    low, high = BANDS[record["args"]["task"]]
    assert low <= result.avg_at_k <= high, result.as_dict()
    assert result.greedy_acc > 0.0


def test_the_countdown_base_numbers_in_docs_are_its_record():
    """docs/tasks.md quotes the shipped countdown base's scores and step count: they are its pretrain.json's."""
    from pathlib import Path

    record = json.loads((builtin_path("tiny-countdown-moe") / "pretrain.json").read_text())
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tasks.md").read_text()
    final = record["final"]
    quoted = (f"avg@8 {100 * final['avg_at_k']:.1f} %, greedy {100 * final['greedy_acc']:.1f} %, pass@8\n"
              f"{100 * final['pass_at_k']:.1f} %")  # fmt: skip
    assert quoted in doc
    assert f"`steps_run` is {record['steps_run']}" in doc and f"--steps {record['steps_run']}`" in doc
