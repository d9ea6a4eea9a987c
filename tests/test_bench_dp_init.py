"""benchmarks/dp_init.py: its logic on a tiny shape (--quick, two torchrun jobs of 2 ranks), and its errors."""

import pytest
from benchmarks import dp_init
from benchmarks._report import DOC


def test_quick_run_reports_every_rank_of_both_modes_and_writes_nothing(capsys):
    before = DOC.read_text() if DOC.exists() else None
    assert dp_init.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| loaded |", "| meta |"))]
    assert [r.split("|")[1:3] for r in rows] == [[f" {m} ", f" {r} "] for m in ("loaded", "meta") for r in (0, 1)]
    assert (DOC.read_text() if DOC.exists() else None) == before


def test_an_unknown_mode_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        dp_init.main(["--quick", "--modes", "loaded,bogus"])
    assert e.value.code == 2 and "--modes" in capsys.readouterr().err
