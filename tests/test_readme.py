"""The README's tensor example must run as printed and produce SAT's diagnostics."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_sat_example_runs():
    block = re.search(r"## The SAT loss on tensors\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gate_rate" in out.stdout and "q" in out.stdout
