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
                   "| fp32 | 2 | 0.0e+00 |", "| bf16 | 2 | 0.0e+00 |"):  # 1-rank DP = one process, on CPU bit for bit
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
    from benchmarks import gpu_trainer

    from satrl.training import trainer as trainer_mod

    real, made = trainer_mod.Trainer, []

    def second_run_skewed(*args, **kw):
        made.append(1)
        return real(*args, **{**kw, "lr": kw["lr"] * (1.01 if len(made) == 2 else 1.0)})

    monkeypatch.setattr(trainer_mod, "Trainer", second_run_skewed)
    assert not gpu_trainer.sat_parity("cpu")["equal"]
