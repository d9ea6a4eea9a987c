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
