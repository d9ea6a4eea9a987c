"""Issue 60: a grid checks every run's config before its first run starts. Before the fix the valid runs trained
first, then each bad one failed (a negative lr, a misspelt key, a lag of -1, a base that is not a config); now
the grid is one line naming the run and the field, exit 2, and no run folder is made."""

import argparse

import pytest
import yaml

from run_helpers import TINY
from satrl.apps import grid as grid_app


def _grid(tmp_path, bad: dict) -> str:
    (tmp_path / "base.yaml").write_text("{}\n")
    extra = dict(item.split("=", 1) for item in TINY)
    spec = {
        "base": "base.yaml",
        "lags": [1],
        "seeds": 1,
        "steps": 2,
        "extra": extra,
        "cells": {"ok": {}, "bad": bad},
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def _cli(capsys, *argv: str) -> tuple[int, str, list[str]]:
    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    capsys.readouterr()
    rc = grid_app.run_grid(parser.parse_args(list(argv)))
    got = capsys.readouterr()
    return rc, got.out, got.err.strip().splitlines()


CASES = [
    ({"train.lr": -1}, "train.lr"),
    ({"train.lrr": 0.1}, "train.lrr"),
    ({"lags": [-1]}, "lag.n"),
    ({"base": "/etc/passwd"}, "/etc/passwd"),
]


@pytest.mark.parametrize("bad, field", CASES)
def test_a_bad_run_config_stops_the_grid_before_any_run(tmp_path, capsys, bad, field):
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, _grid(tmp_path, bad), "--out", str(out))
    assert rc == 2 and len(err) == 1, err
    assert "bad/lag" in err[0] and field in err[0] and "no run was started" in err[0], err
    assert not (out / "ok").exists() and not (out / "bad").exists()


def test_dry_run_says_which_config_would_be_refused(tmp_path, capsys):
    rc, out, _ = _cli(capsys, _grid(tmp_path, {"train.lr": -1}), "--dry-run", "--out", str(tmp_path / "out"))
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 2
    assert "config refused" not in lines[0] and "config refused: invalid config: train.lr" in lines[1], lines
