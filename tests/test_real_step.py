"""benchmarks/real_step.py: one training step of a config, in process, split by phase (docs/real-models.md, "Where a
training step's time goes"), run here on the built-in tiny policy."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.real_step import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["steps=2", "train.prompts_per_batch=2", "train.group_size=2", "engine.max_new_tokens=4"]


def _phases(tmp_path: Path, *overrides: str) -> dict[str, dict]:
    out = tmp_path / "steps.json"
    assert main([str(REPO / "configs" / "grpo.yaml"), *TINY, *overrides, "--steps", "1", "--threads", "1",
                 "--json", str(out)]) == 0  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["steps"][0]["shape"][0] == 4  # 2 prompts x 2 samples
    return {row["phase"]: row for row in rec["steps"][0]["rows"]}


def test_opob_has_its_score_norm_pass_and_the_split_its_forward(tmp_path):
    rows = _phases(tmp_path, "objective=vcpo", "objective.ess_step=false", "diagnostics.decompose=true")
    assert list(rows) == ["advantages", "version_logp", "step", "weights_copy", "buckets"]
    assert all(r["peak_mb"] >= r["after_mb"] > 0 and r["cpu_s"] >= 0 for r in rows.values())


def test_grpo_without_the_split_has_neither(tmp_path):
    rows = _phases(tmp_path, "diagnostics.decompose=false")
    assert "version_logp" not in rows and rows["advantages"]["cpu_s"] < 0.5  # GRPO's group mean: no forward
