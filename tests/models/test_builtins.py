"""The shipped base policies: they load, record how to regenerate them, and score in the base band.

The band is avg@8 in [0.2, 0.6] (temperature 1, eval split), DESIGN/issue 3. The score here uses 50 eval
problems x 8 samples through the same evaluate() and torch engine as `satrl eval`, so it is a noisy
estimate (the checkpoints were calibrated to the middle of the band, see their pretrain.json).
"""

from __future__ import annotations

import json

import pytest

from satrl.engines import EngineSpec, TorchEngine
from satrl.models import BUILTINS, builtin_path, count_params, load_policy
from satrl.tasks import make_task
from satrl.tasks.evaluate import evaluate


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_shipped_files_and_record(name):
    path = builtin_path(name)
    assert (path / "model.safetensors").stat().st_size <= 10 * 2**20
    record = json.loads((path / "pretrain.json").read_text())
    cmd = record["command"]
    assert cmd.startswith(f"satrl pretrain --model {name} --steps {record['steps_run']} --seed 0 ")
    assert record["args"]["steps"] == record["steps_run"]
    assert 0.2 <= record["final"]["avg_at_k"] <= 0.6
    model, _ = load_policy(name)
    assert count_params(model) == record["params"]


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_shipped_policy_scores_in_band(name):
    model, tok = load_policy(name)
    engine = TorchEngine(model, EngineSpec(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tokenizer=tok, numerics="fp32"))  # fmt: skip
    task = make_task("arithmetic", digits=3, ops="+")
    result = evaluate(engine, tok, task, k=8, n_problems=50, seed=1)
    assert 0.2 <= result.avg_at_k <= 0.6, result.as_dict()
    assert result.greedy_acc > 0.0
