"""The CI smoke grid end to end with the real `satrl train`: `satrl grid` -> run dirs -> `satrl report`.

The policy is a freshly initialised tiny model saved to a temp folder (model.path=...), so the test does
not depend on the shipped pretrained checkpoints; avg@k is ~0, but every number still has to travel
from summary.json into the report unchanged. The grid's runs are `python -m satrl train` processes, as the product
starts them; `satrl report` needs no process of its own and is called in this one (`satrl.cli.main`), sparing
~3.7 s CPU of imports.
"""

import json
import os
from pathlib import Path

import pytest

from satrl import cli
from satrl.config import load_config
from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.experiments.mdtext import fmt_ci
from satrl.experiments.stats import mean_ci
from satrl.models.tiny import build_tiny_model
from satrl.models.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ci_smoke_grid_then_report(tmp_path, capsys):
    tok = build_char_tokenizer()
    policy = tmp_path / "policy"
    build_tiny_model("dense", vocab_size=len(tok), seed=0).save_pretrained(policy)
    tok.save_pretrained(policy)
    spec = load_grid(REPO / "configs" / "grids" / "ci_smoke.yaml")
    spec.extra["model.path"] = str(policy)
    out = tmp_path / "ci_smoke"
    result = run_grid_spec(spec, out, workers=2, progress=False)
    errors = {n: r.error for n, r in result.records.items() if r.error}
    assert result.exit_code == 0, errors
    assert sorted(result.names("finished")) == [
        f"{c}/lag2/seed{s}" for c in ("grpo", "sat_grpo") for s in (0, 1)
    ]
    saved = load_config(out / "grpo" / "lag2" / "seed0" / "config.yaml")  # the grid's thread cap is in it
    assert saved.train.max_threads == max(1, (os.cpu_count() or 1) // 2) and saved.trainer_threads == 1

    capsys.readouterr()
    assert cli.main(["report", str(out), "--resamples", "2000"]) == 0, capsys.readouterr().err[-3000:]
    md = (out / "report.md").read_text()
    for fig in ("eval_curves", "d_pi", "sat_diagnostics", "gate_check", "bylag", "paired"):
        assert (out / "figures" / f"{fig}.png").exists(), fig
    for label, cell in (("GRPO", "grpo"), ("SAT-GRPO", "sat_grpo")):
        sums = [json.loads((out / cell / "lag2" / f"seed{s}" / "summary.json").read_text()) for s in (0, 1)]
        row = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
        late = mean_ci([s["late_test_avg_at_k"] for s in sums], n_resamples=2000)
        dpi = mean_ci([s["d_pi_last25"] for s in sums], n_resamples=2000)
        assert row.startswith(f"| {label} | 2 | ") and fmt_ci(*late) in row and fmt_ci(*dpi, "{:.4f}", 1.0) in row
        assert all(s["steps"] == 4 for s in sums)
        # val and test parts are disjoint and scored at every eval, including step 0
        ev = [json.loads(line) for line in (out / cell / "lag2" / "seed0" / "eval.jsonl").read_text().splitlines()]
        assert ev[0]["step"] == 0 and all({"val_avg_at_k", "test_avg_at_k"} <= e.keys() for e in ev)
    assert "| SAT-GRPO | GRPO | 2 | " in md and "late test avg@k" in md
