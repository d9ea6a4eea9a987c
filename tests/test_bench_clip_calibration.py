"""benchmarks.clip_calibration: the ε read off a line in (ε, log clip fraction), checked on hand-derived points,
and the command on run folders (plain and gzipped metrics), with a one-line error when a glob matches nothing."""

import gzip
import json
import math

import pytest
from benchmarks.clip_calibration import main, matched_eps


def test_matched_eps_on_hand_derived_points():
    # log f falls by 2 per 0.1 of ε: the midpoint of the log fractions is the midpoint of ε
    assert matched_eps((0.1, math.exp(-2)), (0.2, math.exp(-4)), math.exp(-3)) == pytest.approx(0.15)
    # the points' order does not matter, and the target at a point gives that point's ε
    assert matched_eps((0.2, math.exp(-4)), (0.1, math.exp(-2)), math.exp(-2)) == pytest.approx(0.1)
    # 0.05 + ln(2)/ln(10) · 0.15 = 0.0951...: rounded to the nearest 0.005
    assert matched_eps((0.05, 0.1), (0.2, 0.01), 0.05) == pytest.approx(0.095)
    with pytest.raises(ValueError, match="positive"):
        matched_eps((0.05, 0.0), (0.2, 0.01), 0.05)


def _run(path, clipfracs, gz=False):
    path.mkdir(parents=True)
    text = "".join(json.dumps({"step": i, "obj/clipfrac": c}) + "\n" for i, c in enumerate(clipfracs))
    if gz:
        with gzip.open(path / "metrics.jsonl.gz", "wt") as f:
            f.write(text)
    else:
        (path / "metrics.jsonl").write_text(text)


def test_command_reads_run_folders(tmp_path, capsys):
    _run(tmp_path / "target/lag1/seed1", [0.04, 0.06], gz=True)  # mean 0.05
    _run(tmp_path / "target/lag1/seed2", [0.05])
    _run(tmp_path / "a/lag1/seed99", [0.1])
    _run(tmp_path / "b/lag1/seed1", [0.02, 0.0], gz=True)  # mean 0.01
    argv = [f"{tmp_path}/target/lag1/seed*", "0.05", f"{tmp_path}/a/lag1/seed*", "0.2", f"{tmp_path}/b/lag1/seed*"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "target clip fraction 0.05000 (2 runs)" in out and "matched eps 0.095" in out
    assert main([f"{tmp_path}/none/seed*", *argv[1:]]) == 2
    assert "matches no run folder" in capsys.readouterr().err


def test_compare_says_whether_the_match_held(tmp_path, capsys):
    _run(tmp_path / "sat/lag1/seed1", [0.04])
    _run(tmp_path / "sat/lag1/seed2", [0.06])  # target 0.05
    _run(tmp_path / "near/lag1/seed1", [0.06], gz=True)  # +20 %: within 25 %
    _run(tmp_path / "far/lag1/seed1", [0.03])  # -40 %: beyond
    assert main(["--compare", f"{tmp_path}/sat/lag1/seed*", f"{tmp_path}/near/lag1/seed*"]) == 0
    out = capsys.readouterr().out
    assert "target 0.05000 (2 runs); matched 0.06000 (1 run); relative difference +20.0%, within" in out
    assert main(["--compare", f"{tmp_path}/sat/lag1/seed*", f"{tmp_path}/far/lag1/seed*"]) == 0
    assert "relative difference -40.0%, beyond the 25% tolerance" in capsys.readouterr().out
    assert main(["--compare", f"{tmp_path}/sat/lag1/seed*"]) == 2
    assert main(["--compare", f"{tmp_path}/sat/lag1/seed*", f"{tmp_path}/none/seed*"]) == 2
    assert "matches no run folder" in capsys.readouterr().err
