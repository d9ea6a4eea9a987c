"""Issue 60: write errors at every entry point are one line, exit 2, no traceback, and leave no truncated file. A
read-only ``--out`` (under /sys, read-only even for root) or a full one (a filled tmpfs; tests run as root) for
``satrl report``, ``satrl leaderboard`` and ``satrl grid``, and a full disk during ``satrl export`` (safetensors'
own error type, a traceback before the fix; the report left a truncated figure)."""

import json
import os
import subprocess

import pytest
import yaml

from run_helpers import TINY
from satrl.cli import main

READ_ONLY = "/sys/satrl-test-out"


@pytest.fixture
def small(tmp_path):
    """A 1 MiB tmpfs: room for a config file, not for a policy's weights."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def full(small):
    """The small tmpfs with every byte taken."""
    with open(small / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return small


def _one_line(capsys, *argv) -> str:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], (rc, err)
    return err[0]


def _left(folder) -> list[str]:
    """What a refused command left under ``folder`` (the filler aside): nothing, or complete files only."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "filler")


def _run(out, cell, lag, seed, score):
    d = out / cell / f"lag{lag}" / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "finished", "late_test_avg_at_k": score,
                                                "summary_version": 2}))  # fmt: skip
    (d / "config.yaml").write_text(f"seed: {seed}\n")
    (d / "metrics.jsonl").write_text('{"step": 1, "mismatch/d_pi": 0.01}\n')
    (d / "eval.jsonl").write_text(json.dumps({"step": 1, "avg_at_k": score, "k": 8}) + "\n")


@pytest.fixture
def grid_out(tmp_path):
    """A grid folder: GRPO at lags 0 and 8, and `half` at lag 8, seeds 0-2."""
    out = tmp_path / "grid"
    for s in range(3):
        for cell, lag, v in (
            ("grpo", 0, 0.8 + s / 100),
            ("grpo", 8, 0.7 + s / 100),
            ("half", 8, 0.75 + s / 100),
        ):
            _run(out, cell, lag, s, v)
    (out / "grid.yaml").write_text("cells: {grpo: {label: GRPO}, half: {}}\n")
    return out


@pytest.mark.parametrize("where", ["read-only", "full"])
def test_report_into_an_unwritable_out(grid_out, full, capsys, where):
    dest = READ_ONLY if where == "read-only" else full / "rep"
    line = _one_line(capsys, "report", grid_out, "--out", dest, "--resamples", "50")
    assert line.startswith("satrl report: cannot write the report: ") and str(dest) in line, line
    assert _left(full) == []  # no report.md, no truncated figure


@pytest.mark.parametrize("where", ["read-only", "full"])
def test_leaderboard_into_an_unwritable_out(grid_out, full, tmp_path, capsys, where):
    spec = tmp_path / "lb.yaml"
    spec.write_text(yaml.safe_dump({"title": "T", "description": "D", "methods": [{"cell": "half", "label": "Half"}],
                                    "testbeds": [{"key": "a", "name": "A", "results": "grid", "trial": "t",
                                                  "base": "grpo", "lag": 8, "reference_lag": 0, "seeds": [0, 2]}]}))  # fmt: skip
    dest = READ_ONLY if where == "read-only" else full / "lb"
    line = _one_line(capsys, "leaderboard", spec, "--out", dest, "--resamples", "50")
    assert line.startswith("satrl leaderboard: cannot write the leaderboard: ") and str(dest) in line, line
    assert _left(full) == []


@pytest.mark.parametrize("where", ["read-only", "full"])
def test_grid_into_an_unwritable_out(tmp_path, full, capsys, where):
    (tmp_path / "base.yaml").write_text("{}\n")
    extra = dict(item.split("=", 1) for item in TINY)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "lags": [1], "seeds": 1, "steps": 2,
                                                     "extra": extra, "cells": {"a": {}}}))  # fmt: skip
    dest = READ_ONLY if where == "read-only" else full / "g"
    line = _one_line(capsys, "grid", tmp_path / "g.yaml", "--out", dest)
    assert line.startswith(f"satrl grid: cannot write into --out {dest}: "), line
    assert not list((full / "g").glob("a/lag1/seed0/metrics.jsonl")) if where == "full" else True


def test_export_onto_a_full_disk(shared_tiny, small, capsys):
    """The config files fit, the weights do not: safetensors' own error type, a traceback before the fix."""
    run = shared_tiny("steps=2")
    line = _one_line(capsys, "export", run, small / "hf")
    assert line == f"satrl export: cannot write {small / 'hf'}: No space left on device", line
    assert os.listdir(small) == []  # no half folder
