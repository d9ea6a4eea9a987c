"""benchmarks/objectives.py's pieces on tiny inputs: the allocator pinning, a step and the pairs."""

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import objectives as bench


def test_steady_allocator_pins_glibc():
    """In a child process: pinning malloc's thresholds is for the benchmark's process, not the test suite's."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt is Linux-only")
    code = "from benchmarks.objectives import steady_allocator; print(steady_allocator())"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "True"


def test_step_backpropagates_each_preset():
    x = bench.make_inputs(4096)
    for preset in bench.PRESETS:
        bench.step(preset, x)
        assert x["logp"].grad is not None and x["logp"].grad.abs().sum() > 0, preset


def test_paired_ratios_cover_the_available_pairs():
    rows = bench.rows_available()
    pairs = bench.paired_ratios(4096, 1, rows)
    assert ("sat_grpo", "grpo") in pairs and all(r > 0 for r, _, _ in pairs.values())
    assert all(a in rows and b in rows for a, b in pairs)
