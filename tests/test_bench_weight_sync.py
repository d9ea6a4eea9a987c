"""benchmarks/weight_sync.py: its logic on a tiny shape (--quick), and the memory probe it relies on."""

import torch
from benchmarks import weight_sync
from benchmarks._report import DOC


def test_quick_run_reports_both_paths_and_writes_nothing(capsys):
    before = DOC.read_text() if DOC.exists() else None
    assert weight_sync.main(["--quick", "--versions", "1"]) == 0
    out = capsys.readouterr().out
    assert "| bytes (inproc: pickled fp32 state dict) |" in out and "| dist (gloo, bf16 buckets) |" in out
    assert "Speed-up per version:" in out
    assert (DOC.read_text() if DOC.exists() else None) == before


def test_peak_rss_sees_a_large_temporary():
    with weight_sync.PeakRss() as mem:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del x
    assert mem.peak >= 60 * 2**20
