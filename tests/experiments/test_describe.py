"""`satrl report --describe`: each cell's mean of training metrics over steps. Hand-derived values, a metric only some
cells log, the flag recorded in the provenance line, and bad input (one line, exit 2)."""

import textwrap

import pandas as pd
import pytest

from satrl.cli import main
from satrl.experiments.describe import describe, parse_describe, runtime

GRID = "cells: {grpo: {lags: [0, 32], label: GRPO}, opob: {lags: [32], label: OPOB}}\n"


def _steps(shift, scale=None, n=4):
    """n logged steps whose obj/opob_shift averages ``shift`` (values shift-1e-3 .. around it); lr scale if given."""
    out = []
    for i in range(n):
        m = {"step": i + 1, "obj/opob_shift": shift + (i - (n - 1) / 2) * 1e-3, "obj/clipfrac": 0.01}
        if scale is not None:
            m["train/lr_scale"] = scale
        out.append(m)
    return out


def test_hand_derived_means():
    """Two runs whose step means are 0.2 and 0.4: the cell's mean 0.3, range 0.2-0.4; a NaN step is skipped."""
    rows = [dict(cell="opob", lag=32, seed=s, step=i, **{"obj/opob_shift": v})
            for s, vals in ((0, [0.1, 0.3, float("nan")]), (1, [0.4, 0.4])) for i, v in enumerate(vals)]  # fmt: skip
    t = describe(pd.DataFrame(rows), ("obj/opob_shift",))
    assert t.to_dict("records") == [dict(cell="opob", lag=32, key="obj/opob_shift", n=2, mean=pytest.approx(0.3),
                                         min=pytest.approx(0.2), max=pytest.approx(0.4))]  # fmt: skip


def test_parse_refuses_an_empty_key():
    assert parse_describe("obj/opob_shift, train/lr_scale") == ("obj/opob_shift", "train/lr_scale")
    for bad in ("", "a,,b", "a,"):
        with pytest.raises(ValueError, match="metric keys separated by commas"):
            parse_describe(bad)


@pytest.fixture
def grid(tmp_path, make_run):
    out = tmp_path / "grid"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for seed in range(2):
        make_run(out, "grpo", 0, seed, {"late_test_avg_at_k": 0.8}, metrics=_steps(0.0 + seed))
        make_run(out, "grpo", 32, seed, {"late_test_avg_at_k": 0.7}, metrics=_steps(0.0))
        make_run(out, "opob", 32, seed, {"late_test_avg_at_k": 0.75}, metrics=_steps(0.3 + 0.1 * seed, scale=0.9))
    return out


def test_report_flag_adds_the_table_and_records_itself(grid):
    assert main(["report", str(grid), "--resamples", "50", "--describe", "obj/opob_shift,train/lr_scale"]) == 0
    md = (grid / "report.md").read_text()
    sec = md.split("## What the controls did (descriptive)")[1].split("\n## ")[0]
    assert "| method | lag | runs | `obj/opob_shift` | `train/lr_scale` |" in sec
    assert "| GRPO | 0 | 2 | 0.5 (0–1) | — |" in sec  # run means 0 and 1; GRPO never logs the lr scale
    assert "| OPOB | 32 | 2 | 0.35 (0.3–0.4) | 0.9 (0.9–0.9) |" in sec
    assert "--describe obj/opob_shift,train/lr_scale`" in md  # the provenance line regenerates it


def test_report_flag_refuses_a_metric_no_run_logged(grid, capsys):
    assert main(["report", str(grid), "--resamples", "50", "--describe", "obj/opob_shift,obj/opob_shfit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run logged obj/opob_shfit" in err[0]


def test_report_flag_refuses_a_malformed_value(grid, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(grid), "--describe", "a,,b"])
    assert exc.value.code == 2 and "metric keys separated by commas" in capsys.readouterr().err.splitlines()[-1]


def test_runtime_hand_derived():
    """Three finished runs of 100, 200 and 600 s: median 200, range 100-600, 900 s = 0.25 machine-hours; a run not
    finished and a finished one with no recorded time are left out."""
    rows = [dict(cell="opob", lag=32, seed=s, status="finished", wall_time_s=w) for s, w in enumerate((100, 600, 200))]
    rows += [dict(cell="opob", lag=32, seed=7, status="partial", wall_time_s=5000.0),
             dict(cell="opob", lag=32, seed=8, status="finished", wall_time_s=float("nan"))]  # fmt: skip
    t = runtime(pd.DataFrame(rows))
    assert t.to_dict("records") == [dict(cell="opob", lag=32, n=3, median=200, min=100, max=600,
                                         hours=pytest.approx(0.25))]  # fmt: skip


def test_every_report_says_what_each_cell_cost(tmp_path, make_run):
    """The section's rows: the median (fastest-slowest), its ratio to the grid's base at the same lag (none for the
    base itself, nor where the base did not run that lag) and the machine-hours."""
    out = tmp_path / "grid"
    out.mkdir()
    (out / "grid.yaml").write_text("baseline: grpo\n" + GRID.replace("opob: {lags: [32]", "opob: {lags: [0, 32]"))
    for seed, (g, o) in enumerate(((200, 300), (400, 500), (300, 700))):
        make_run(out, "grpo", 32, seed, {"late_test_avg_at_k": 0.7, "wall_time_s": g})
        make_run(out, "opob", 32, seed, {"late_test_avg_at_k": 0.75, "wall_time_s": o})
        make_run(out, "opob", 0, seed, {"late_test_avg_at_k": 0.75, "wall_time_s": 90})
    assert main(["report", str(out), "--resamples", "50"]) == 0
    sec = (out / "report.md").read_text().split("## Run time (descriptive)")[1].split("\n## ")[0]
    assert "ratio of its median to the base's (GRPO) at the same lag" in sec
    assert "| GRPO | 32 | 3 | 300 (200–400) | — | 0.25 |" in sec
    assert "| OPOB | 0 | 3 | 90 (90–90) | — | 0.07 |" in sec  # no GRPO run at lag 0 to compare with
    assert "| OPOB | 32 | 3 | 500 (300–700) | 1.67 | 0.42 |" in sec
