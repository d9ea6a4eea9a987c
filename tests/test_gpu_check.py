"""benchmarks/gpu_check.py is meant for a lent GPU machine; its logic runs here on CPU in --quick mode."""

import pytest
import torch
from benchmarks import gpu_check
from benchmarks._report import DOC


def test_gpu_check_logic_runs_on_cpu(capsys):
    before = DOC.read_text() if DOC.exists() else None
    assert gpu_check.main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    for needle in ("| tiny-arith | 2 |", "| tiny-arith-moe | 2 |", "| 64K |", "| 256K |",
                   "| tiny bf16 + checkpointing + chunked log-probs | 256 | 2 |", "equal within tolerance",
                   "| fp32 | 2 | 0.0e+00 | 0 (bits) | True |", "| bf16 | 2 | 0.0e+00 | 0 (bits) | True |",  # 1-rank DP =
                   "| tiny, configs/qwen3_gpu.yaml trainer settings | 16 |",  # one process, on CPU bit for bit
                   "| tiny on cpu, bf16 buckets of 256 MiB | 2 |"):  # the RL batch and the weight-time rows
        assert needle in out, needle
    assert "| True |" in out and "| False |" not in out  # every loss finite
    assert "NOT equal" not in out
    assert (DOC.read_text() if DOC.exists() else None) == before  # --quick never writes the docs


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_gpu_check_without_cuda_says_what_to_do():
    with pytest.raises(SystemExit, match="no CUDA device here"):
        gpu_check.main([])


def test_sat_parity_can_fail(monkeypatch):
    """The CPU-vs-device comparison reports a difference when the two runs differ (here: the second run's lr)."""
    import dataclasses

    from benchmarks import gpu_trainer

    from satrl.training import trainer as trainer_mod

    real, made = trainer_mod.Trainer, []

    def second_run_skewed(model, objective, settings):
        made.append(1)
        return real(model, objective, dataclasses.replace(settings, lr=settings.lr * (1.01 if len(made) == 2 else 1.0)))

    monkeypatch.setattr(trainer_mod, "Trainer", second_run_skewed)
    p = gpu_trainer.sat_parity("cpu", steps=1)  # one step: the skewed lr already moves the weights apart
    assert not p["equal"] and p["weight_rel"] > p["rtol"]


def test_gpu_check_finds_satrl_without_pythonpath_or_install(tmp_path):
    """On the GPU machine satrl is not installed: the script puts the clone's src/ on the path itself. Here
    ``python -S`` skips the editable install's .pth, so only the script's own path setup can find satrl."""
    import os
    import site
    import subprocess
    import sys
    from pathlib import Path

    root = Path(gpu_check.__file__).resolve().parent.parent
    code = (f"import sys, runpy; sys.path.append({site.getsitepackages()[0]!r}); "
            "import importlib.util; assert importlib.util.find_spec('satrl') is None; "
            f"sys.argv = ['gpu_check.py', '--help']; runpy.run_path({str(root / 'benchmarks' / 'gpu_check.py')!r}, "
            "run_name='__main__')")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the script may put src/ on the path
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--out" in done.stdout
