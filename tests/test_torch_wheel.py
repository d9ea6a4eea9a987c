"""tools/torch_wheel.py: `make` stops in one line before pulling PyTorch's CUDA build onto a machine without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "torch_wheel.py"
spec = importlib.util.spec_from_file_location("torch_wheel", TOOL)
tw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tw)

CUDA = [("torch", "2.13.0"), ("nvidia-cublas-cu12", "12.8"), ("sympy", "1.14")]
CPU = [("torch", "2.13.0+cpu"), ("sympy", "1.14")]


def test_only_a_cuda_build_without_a_gpu_stops():
    assert tw.cuda_without_gpu(CUDA, has_gpu=False)
    assert not tw.cuda_without_gpu(CUDA, has_gpu=True)
    assert not tw.cuda_without_gpu(CPU, has_gpu=False)
    assert not tw.cuda_without_gpu([], has_gpu=False)  # torch already installed: nothing to install
    assert tw.cuda_without_gpu([("torch", "2.13.0")], has_gpu=False)  # a plain version is the CUDA build on Linux


def test_the_stop_is_one_line_naming_the_cpu_wheels_command(monkeypatch, capsys):
    monkeypatch.setattr(tw, "would_install", lambda pip, spec: CUDA)
    monkeypatch.setattr(tw, "has_nvidia_gpu", lambda: False)
    assert tw.main([".venv/bin/pip", "torch==2.13.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--index-url https://download.pytorch.org/whl/cpu" in err


def test_this_machines_plan_passes():
    """Here pip finds the CPU wheel (the environment's find-links), so `make` goes on: the real pip, asked."""
    plan = tw.would_install(str(Path(sys.executable).parent / "pip"), "torch==2.13.0")
    assert not tw.cuda_without_gpu(plan, tw.has_nvidia_gpu())
