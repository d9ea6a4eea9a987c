"""The one-off migration of legacy run folders (benchmarks/migrate_results.py): what it translates reproduces
what the run did, it is idempotent, and the committed packed runs are already in today's format."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import yaml
from benchmarks import migrate_results as mig

from satrl.config import RunConfig
from satrl.experiments.store import find_runs, load_runs
from satrl.tasks import make_task
from satrl.tasks.evaluate import split_val_test

REPO = Path(__file__).resolve().parents[2]


def _legacy_config() -> dict:
    """A config.yaml as runs saved it before the val/test split and the step-0 evaluation."""
    data = RunConfig().model_dump(mode="json")
    for key in ("at_start", "val_problems", "test_problems", "engine"):
        del data["eval"][key]
    data["eval"]["n_problems"] = 100
    del data["ray"], data["train"]["max_threads"], data["collapse"]["eval_frac"]
    return data


def _legacy_run(root: Path) -> Path:
    run = root / "grpo" / "lag8" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(_legacy_config(), sort_keys=False))
    # rows logged before lag/min and train/tokens; the eval score before the split (pooled), no step 0
    rows = [{"step": s, "loss": 0.1, "train/reward": 0.5, "mismatch/d_pi": 0.01, "lag/mean": 5.0, "lag/max": 6.0,
             "bylag/4/frac_tokens": 0.5, "bylag/6/frac_tokens": 0.5, "bylag/9/frac_tokens": 0.0} for s in range(1, 9)]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"step": 2, "avg_at_k": 0.4, "k": 8}, {"step": 4, "avg_at_k": 0.6, "k": 8},
             {"step": 6, "avg_at_k": 0.2, "k": 8}, {"step": 8, "avg_at_k": 0.2, "k": 8}]  # fmt: skip
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    summary = {"best_avg_at_k": 0.6, "best_step": 4, "final_avg_at_k": 0.2, "collapse_step": 7,
               "d_pi_last25": 0.0123, "steps": 8, "wall_time_s": 1.0, "status": "finished"}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_n_problems_becomes_val_and_test_counts_that_pick_the_same_problems_in_order():
    cfg = mig.migrate_config(_legacy_config())
    first = list(itertools.islice(make_task("arithmetic").problems("eval", 0), 100))
    pool, val_idx, test_idx = split_val_test(make_task("arithmetic").problems("eval", 0),
                                             cfg.eval.val_problems, cfg.eval.test_problems)  # fmt: skip
    assert [p.prompt for p in pool] == [p.prompt for p in first]  # the old evaluator's problems, same order
    assert len(val_idx) + len(test_idx) == 100 and cfg.eval.at_start is False
    kept = RunConfig().model_dump(mode="json")  # a config with the key keeps its value
    assert mig.migrate_config(kept).eval.at_start is True


def test_legacy_run_is_migrated_once_and_keeps_its_numbers(tmp_path):
    run = _legacy_run(tmp_path)
    assert sorted(mig.migrate_run(find_runs(tmp_path)[0])) == ["config.yaml", "summary.json"]
    s = json.loads((run / "summary.json").read_text())
    # stored keys keep their values; the collapse is the eval rule now, the stored one the reward rule's
    assert (s["best_avg_at_k"], s["d_pi_last25"], s["reward_collapse_step"]) == (0.6, 0.0123, 7)
    assert s["collapse_step"] == 6 and s["collapse_score"] == "avg_at_k" and s["late_avg_at_k"] == 0.2
    # lags from the bylag buckets that hold tokens (lag 9 holds none), equal weights per step
    assert s["lag_realized"] == {"mean": 5.0, "min": 4.0, "max": 6.0}
    assert s["summary_version"] == "1 (upgraded to 2)"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert "n_problems" not in cfg["eval"] and cfg["ray"] == RunConfig().ray.model_dump(mode="json")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert mig.migrate_run(find_runs(tmp_path)[0]) == []  # idempotent: a fixed point
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert load_runs(tmp_path)["collapse_step"].tolist() == [6]  # the store reads it as stored


def test_check_reports_what_would_change_and_writes_nothing(tmp_path, capsys):
    run = _legacy_run(tmp_path / "grid")
    before = (run / "config.yaml").read_text()
    assert mig.main([str(tmp_path), "--check"]) == 1
    assert (run / "config.yaml").read_text() == before
    assert "would change: config.yaml in 1, summary.json in 1" in capsys.readouterr().out
    assert mig.main([str(tmp_path)]) == 0 and mig.main([str(tmp_path), "--check"]) == 0


def test_committed_packed_runs_are_in_todays_format():
    """Every run under docs/results loads through today's config loader unchanged and has a current summary:
    after a change to the config schema, rerun `python -m benchmarks.migrate_results docs/results`."""
    assert mig.main([str(REPO / "docs" / "results"), "--check"]) == 0


def test_a_protocol_record_gets_its_first_commit_once(tmp_path):
    """A packed grid_status.json written before records kept the protocol's first commit gets it from git; a
    second pass changes nothing; outside a checkout it is left as it is."""
    import subprocess

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "protocol.md").write_text("# protocol\n")
    git("add", "protocol.md")
    git("commit", "-q", "-m", "protocol")
    added = git("rev-parse", "HEAD").strip()
    (tmp_path / "protocol.md").write_text("# protocol\n\n## Deviation\n")
    git("commit", "-q", "-am", "deviation")
    last = git("rev-parse", "HEAD").strip()
    grid = tmp_path / "grid"
    grid.mkdir()
    rec = {"path": "protocol.md", "commit": last, "committed_at": "2026-12-06T10:00:00+00:00", "blob": "b" * 40}
    (grid / "grid_status.json").write_text(json.dumps({"grid": "g", "protocol": rec}, indent=1))
    assert mig.migrate_status(grid, write=False) == ["grid_status.json"]
    assert json.loads((grid / "grid_status.json").read_text())["protocol"] == rec  # --check writes nothing
    assert mig.migrate_status(grid) == ["grid_status.json"]
    got = json.loads((grid / "grid_status.json").read_text())["protocol"]
    assert got["added"] == added and got["commit"] == last and len(got["added_at"]) == 25
    assert mig.migrate_status(grid) == []  # a fixed point
    outside = tmp_path.parent / (tmp_path.name + "_plain")
    outside.mkdir()
    (outside / "grid_status.json").write_text(json.dumps({"protocol": rec}))
    assert mig.migrate_status(outside) == []
