"""benchmarks/objectives.py's pieces on tiny inputs: the allocator pinning, the torch-path row and the pairs."""

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import objectives as bench

from satrl.objectives import native


def test_steady_allocator_pins_glibc():
    """In a child process: pinning malloc's thresholds is for the benchmark's process, not the test suite's."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt is Linux-only")
    code = "from benchmarks.objectives import steady_allocator; print(steady_allocator())"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "True"


def test_torch_row_turns_the_loops_off_for_its_step_only(monkeypatch):
    seen = []
    real = bench.policy_loss

    def spy(name, **kw):
        seen.append((name, native._state["enabled"]))
        return real(name, **kw)

    monkeypatch.setattr(bench, "policy_loss", spy)
    x = bench.make_inputs(4096)
    bench.step(bench.TORCH_ROW, x)
    bench.step("sat_grpo", x)
    assert seen == [("sat_grpo", False), ("sat_grpo", True)] and native._state["enabled"]


def test_paired_ratios_name_the_torch_path_when_the_loops_run():
    rows = bench.rows_available()
    assert (bench.TORCH_ROW in rows) == native.active()
    pairs = bench.paired_ratios(4096, 1, rows)
    assert ("sat_grpo", "grpo") in pairs and all(r > 0 for r, _, _ in pairs.values())
    assert ((bench.TORCH_ROW, "grpo") in pairs) == native.active()
