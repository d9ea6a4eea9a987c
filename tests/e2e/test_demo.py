"""`satrl demo` end to end at a few steps: both runs, report.md and its PNG."""

import subprocess
import sys

from run_helpers import TINY


def test_demo_writes_report_with_both_runs(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "satrl", "demo", "--out", str(out), "--steps", "2", "--lag", "2", *TINY]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert "| grpo |" in report and "| sat_grpo |" in report
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for method in ("grpo", "sat_grpo"):
        assert (out / method / "summary.json").exists()


def test_demo_regime_is_the_trials():
    """`make demo` previews the trial: its settings equal configs/grids/sat_trial.yaml's (threads aside)."""
    from run_helpers import REPO
    from satrl.demo import REGIME
    from satrl.experiments.spec import load_grid

    spec = load_grid(REPO / "configs" / "grids" / "sat_trial.yaml")
    trial = {k: v for k, v in spec.extra.items() if k != "train.threads"}
    trial.update({"steps": spec.steps, "lag.schedule": spec.lag_schedule})
    assert REGIME == trial
    assert {"grpo", "sat_grpo"} <= set(spec.cells) and 8 in spec.lags
