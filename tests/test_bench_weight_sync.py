"""benchmarks/weight_sync.py: its logic on a tiny shape (--quick), and the memory probe it relies on."""

import mmap

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
    """64 MiB of fresh pages, touched then freed inside the probe. An anonymous mmap, not a tensor: malloc may serve
    a tensor from heap pages an earlier test in the same process already made resident, which raises no RSS (seen
    once in a full run: a peak of one page)."""
    size = 64 * 2**20
    with weight_sync.PeakRss() as mem:
        buf = mmap.mmap(-1, size)
        for i in range(0, size, mmap.PAGESIZE):
            buf[i] = 1
        buf.close()
    assert mem.peak >= 60 * 2**20
