import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from satrl import provenance
from satrl.apps import grid as grid_app
from satrl.experiments import grid as grid_mod
from satrl.experiments.grid import expand, load_grid, render_value, run_grid_spec, thread_env
from satrl.experiments.spec import spec_to_yaml
from satrl.experiments.status import run_status


def read_log(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    (tmp_path / "base.yaml").write_text("steps: 8\n")
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


GRID = """
    base: base.yaml
    lags: [1, 8]
    seeds: 2
    baseline: grpo
    steps: 5
    extra: {model.name: tiny-arith-moe}
    cells:
      grpo: {objective.name: grpo}
      sat: {objective: {name: sat_grpo, alpha: 0.8, invert: true}, lag_schedule: fixed, label: SAT}
      other: {base: other.yaml, lags: [0], proxy_str: "8", nothing: null}
"""


def test_expand_names_overrides_and_order(tmp_path):
    (tmp_path / "other.yaml").write_text("{}\n")
    spec = load_grid(_write(tmp_path, GRID))
    runs = expand(spec, tmp_path / "out")
    assert [r.name for r in runs] == [
        "grpo/lag1/seed0", "grpo/lag1/seed1", "grpo/lag8/seed0", "grpo/lag8/seed1",
        "sat/lag1/seed0", "sat/lag1/seed1", "sat/lag8/seed0", "sat/lag8/seed1",
        "other/lag0/seed0", "other/lag0/seed1",
    ]  # fmt: skip
    sat = runs[6]
    assert sat.overrides == ("model.name=tiny-arith-moe", "steps=5", "lag.schedule=fixed", "lag.n=8",
                             "objective.name=sat_grpo", "objective.alpha=0.8", "objective.invert=true")  # fmt: skip
    assert sat.base == tmp_path / "base.yaml"
    assert sat.run_dir == tmp_path / "out" / "sat" / "lag8" / "seed0"
    other = runs[-1]
    assert other.base == tmp_path / "other.yaml"
    assert "proxy_str='8'" in other.overrides and "nothing=null" in other.overrides
    assert "lag.schedule=broadcast" in other.overrides
    assert len(expand(spec, tmp_path / "out", seeds=5)) == 25
    assert spec.label("sat") == "SAT" and spec.label("grpo") == "grpo"


def test_first_seed_and_a_cell_own_seed_count(tmp_path):
    """Fresh seeds: first_seed shifts every cell's seeds; a cell's own `seeds:` is its count, which --seeds
    leaves alone (the damage trial's one confirming SAT run beside 8-seed GRPO cells)."""
    text = GRID.replace("seeds: 2", "seeds: 2\n    first_seed: 10").replace("label: SAT}", "label: SAT, seeds: 1}")
    (tmp_path / "other.yaml").write_text("{}\n")
    spec = load_grid(_write(tmp_path, text))
    names = [r.name for r in expand(spec, tmp_path / "out")]
    assert names == [
        "grpo/lag1/seed10", "grpo/lag1/seed11", "grpo/lag8/seed10", "grpo/lag8/seed11",
        "sat/lag1/seed10", "sat/lag8/seed10", "other/lag0/seed10", "other/lag0/seed11",
    ]  # fmt: skip
    assert [r.seed for r in expand(spec, "o", seeds=3) if r.cell == "sat"] == [10, 10]
    assert "seed=10" not in expand(spec, "o")[0].overrides  # the seed is passed by the runner, not an override
    again = yaml.safe_load(spec_to_yaml(spec, 2))
    assert again["first_seed"] == 10 and again["cells"]["sat"]["seeds"] == 1


def test_default_command_layout(tmp_path):
    spec = load_grid(
        _write(
            tmp_path,
            GRID.replace('      other: {base: other.yaml, lags: [0], proxy_str: "8", nothing: null}\n', ""),
        )
    )
    run = expand(spec, tmp_path / "out")[0]
    cmd = grid_mod.default_command(run, resume=False)
    assert cmd[:5] == [sys.executable, "-m", "satrl", "train", str(tmp_path / "base.yaml")]
    assert cmd[-3:] == ["seed=0", f"out={run.run_dir}", "--no-progress"]
    assert grid_mod.default_command(run, resume=True)[-2:] == ["--resume", str(run.run_dir)]


@pytest.mark.parametrize(
    "value, text", [(True, "true"), (None, "null"), (0.8, "0.8"), (8, "8"), ("sat_grpo", "sat_grpo"), ("8", "'8'"),
                    ([1, 2], "[1, 2]")],
)  # fmt: skip
def test_render_value_round_trips_through_yaml(value, text):
    assert render_value(value) == text
    assert yaml.safe_load(render_value(value)) == value


@pytest.mark.parametrize(
    "body, match",
    [
        ("base: base.yaml\nlags: [1]\nseed: 3\ncells: {a: {}}\n", "seed"),  # typo for `seeds`
        ("base: base.yaml\nlags: [1]\nbaseline: b\ncells: {a: {}}\n", "baseline: 'b' is not a cell"),
        ("base: base.yaml\nlags: [1]\npairs: {a: z}\ncells: {a: {}}\n", "pairs: 'z' is not a cell"),
        (
            "base: base.yaml\nlags: [1]\ncells: {a: {lag.n: 4}}\n",
            "cells.a: key 'lag.n' is set by the grid; use lags:",
        ),
        ("base: base.yaml\nlags: [1]\nextra: {seed: 1}\ncells: {a: {}}\n", "extra: key 'seed'"),
        ("lags: [1]\ncells: {a: {}}\n", "cells.a: no base config"),
        ("base: base.yaml\nlags: []\ncells: {a: {}}\n", "lags"),
        ("base: base.yaml\nlags: [1]\ncells: {}\n", "cells must be a non-empty mapping"),
        (
            "base: base.yaml\nlags: [1]\ncells: {a: {base: nope.yaml}}\n",
            "cells.a: base config .*nope.yaml does not exist",
        ),
        ("base: base.yaml\nlags: [1]\ncells: {'a/b': {}}\n", "cell name 'a/b'"),
        ("base: base.yaml\nlags: [1]\ncells: {'..': {}}\n", "cell name '..'"),  # its runs: outside --out
        ("base: base.yaml\nlags: [1]\ncells: {a: {}}\nhypotheses: {H1: {method: x, base: a, lag: 1}}\n",
         "hypotheses.H1.method: 'x' is not a cell"),
        ("base: base.yaml\nlags: [1]\ncells: {a: {}, b: {}}\nhypotheses: {H1: {method: b, base: a, lag: 8}}\n",
         "hypotheses.H1.lag: cell 'b' does not run lag 8"),
        ("base: base.yaml\nlags: [1]\ncells: {a: {}, b: {}}\nhypotheses: {H1: {method: b, base: a, lag: 1, endpoint: nope}}\n",
         "unknown endpoint 'nope'"),
        ("base: base.yaml\nlags: [0, 8]\ncells: {a: {}}\nhypotheses: {D: {method: a, base: a, lag: 0, base_lag: 4}}\n",
         "hypotheses.D.base_lag: cell 'a' does not run lag 4"),
        ("base: base.yaml\nlags: [0, 8]\ncells: {a: {}}\nhypotheses: {D: {method: a, base: a, lag: 8}}\n",
         "'a' against itself at the same lag; a damage test sets base_lag"),
    ],
)
def test_grid_errors_name_the_field(tmp_path, body, match):
    with pytest.raises(ValueError, match=match):
        load_grid(_write(tmp_path, body))


def test_builtin_grids_are_valid():
    expected = {"paper_table": (13, 26), "sat_ablation": (10, 10), "falsifier": (5, 5), "lag_sweep": (4, 24),
                "async_random_lag": (4, 4), "ci_smoke": (2, 2), "staleness_damage": (2, 4), "sat_regime": (5, 5), "sat_ablation_regime": (10, 10), "regime_calibration": (12, 24), "sat_trial": (10, 20),
                "damage_trial": (6, 54), "repair_trial": (18, 127), "vcpo_factorial": (6, 68), "countdown_calibration": (2, 4),
                "countdown_calibration_lags": (1, 3), "countdown_damage": (2, 4), "baselines_trial": (5, 8)}  # fmt: skip
    found = {}
    for path in sorted((REPO / "configs" / "grids").glob("*.yaml")):
        spec = load_grid(path, check_paths=False)  # base configs are the pipeline's presets
        runs = expand(spec, "runs/x", seeds=1)
        found[spec.name] = (len(spec.cells), len(runs))
        for r in runs:
            assert r.base.parent.resolve() == (REPO / "configs").resolve(), r.base
    assert found == expected
    falsifier = {
        r.cell: r.overrides for r in expand(load_grid(REPO / "configs/grids/falsifier.yaml", False), "o")
    }
    assert "objective.invert=true" in falsifier["sat_invert"]
    assert "objective.proxy=version_age" in falsifier["sat_version_age"]
    assert all("lag.n=8" in ov and "lag.schedule=broadcast" in ov for ov in falsifier.values())
    sweep = expand(load_grid(REPO / "configs/grids/lag_sweep.yaml", False), "o", seeds=1)
    assert {(r.cell, r.lag) for r in sweep if "lag.schedule=fixed" in r.overrides} >= {("grpo_fixed", 16)}


def test_thread_env_splits_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert thread_env(2)["OMP_NUM_THREADS"] == "4"
    assert thread_env(3) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert thread_env(16)["OMP_NUM_THREADS"] == "1"
    assert thread_env(2, threads=3)["MKL_NUM_THREADS"] == "3"


RUNNER_GRID = """
    base: base.yaml
    lags: [2]
    seeds: 2
    steps: 6
    baseline: a
    cells:
      a: {offset: 0.3}
      b: {offset: 0.4, sat: true}
      bad: {fail: true}
"""


def test_runner_records_failures_and_skips_finished_on_rerun(tmp_path, fake_trainer):
    command, log = fake_trainer
    spec = load_grid(_write(tmp_path, RUNNER_GRID))
    out = tmp_path / "out"
    res = run_grid_spec(spec, out, workers=2, command_fn=command, progress=False, env={"FAKE_LOG": str(log)})
    assert res.exit_code == 1
    assert sorted(res.failed) == ["bad/lag2/seed0", "bad/lag2/seed1"]
    assert sorted(res.names("finished")) == ["a/lag2/seed0", "a/lag2/seed1", "b/lag2/seed0", "b/lag2/seed1"]
    err = (out / "bad/lag2/seed0/error.txt").read_text()
    assert "exit code 3" in err and "boom: this cell is configured to fail" in err
    status = json.loads((out / "grid_status.json").read_text())
    assert status["counts"] == {"finished": 4, "failed": 2}
    assert "boom" in status["runs"]["bad/lag2/seed1"]["error"]
    log_text = (out / "a/lag2/seed1/stdout.log").read_text()
    assert "fake trainer: base=" in log_text and "seed=1" in log_text
    summary = json.loads((out / "b/lag2/seed1/summary.json").read_text())
    assert summary["best_avg_at_k"] == pytest.approx(0.4 + 0.02 - 0.02)
    assert yaml.safe_load((out / "grid.yaml").read_text())["seeds"] == 2
    assert len(read_log(log)) == 4  # the failing runs exit before logging

    res2 = run_grid_spec(spec, out, workers=2, command_fn=command, progress=False, env={"FAKE_LOG": str(log)})
    assert sorted(res2.names("skipped")) == sorted(res.names("finished"))
    assert sorted(res2.failed) == sorted(res.failed)  # retried, failed again
    assert len(read_log(log)) == 4  # nothing finished was rerun
    status2 = json.loads((out / "grid_status.json").read_text())
    assert status["history"] == []  # the first invocation has no earlier one
    (first,) = status2["history"]  # the second keeps the first: its command, commit and the runs it finished
    assert first["started"] == status["started"] and first["git_commit"] == status["git_commit"]
    assert first["cpu"] == status["cpu"] == provenance.machine_kind()  # where each session ran (bits depend on it)
    assert first["finished"] == sorted(res.names("finished"))


def test_runner_resumes_partial_runs(tmp_path, fake_trainer, capsys):
    command, log = fake_trainer
    spec = load_grid(_write(tmp_path, RUNNER_GRID.replace("      bad: {fail: true}\n", "")))
    out = tmp_path / "out"
    partial = out / "a/lag2/seed1"
    (partial / "checkpoints").mkdir(parents=True)
    (partial / "checkpoints" / "step3.pt").write_text("x")
    (partial / "summary.json").write_text("{not json")  # a half-written summary is not valid
    stale = out / "b/lag2/seed0"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 99}\n')  # no checkpoint: a fresh start drops it
    assert run_status(partial) == "partial" and run_status(stale) == "new"
    res = run_grid_spec(spec, out, workers=1, command_fn=command, progress=True, env={"FAKE_LOG": str(log)})
    assert res.exit_code == 0
    err = capsys.readouterr().err  # the rich live line, rendered once more at the end
    assert "done 4/4" in err and "running 0" in err and "failed 0" in err and "ETA" in err
    resumed = {Path(e["out"]).relative_to(out).as_posix(): e["resume"] for e in read_log(log)}
    assert resumed == {"a/lag2/seed0": None, "a/lag2/seed1": str(partial), "b/lag2/seed0": None,
                       "b/lag2/seed1": None}  # fmt: skip
    assert res.records["a/lag2/seed1"].resumed and res.records["a/lag2/seed1"].command[-2] == "--resume"
    assert '"step": 99' not in (stale / "metrics.jsonl").read_text()


def test_runner_respects_worker_limit(tmp_path, fake_trainer):
    command, log = fake_trainer
    spec = load_grid(
        _write(tmp_path, "base: base.yaml\nlags: [1]\nseeds: 3\ncells: {a: {sleep: 0.5}, b: {sleep: 0.5}}\n")
    )
    res = run_grid_spec(spec, tmp_path / "out", workers=2, command_fn=command, progress=False,
                        env={"FAKE_LOG": str(log)}, poll_s=0.05)  # fmt: skip
    assert res.exit_code == 0
    entries = read_log(log)
    assert len(entries) == 6
    events = sorted([(e["start"], 1) for e in entries] + [(e["end"], -1) for e in entries])
    level, peak = 0, 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert peak == 2  # parallel, but never more than 2
    cores = os.cpu_count() or 1
    assert all(int(e["threads"]) * min(2, cores) <= max(cores, 1) for e in entries)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_children_and_marks_interrupted(tmp_path, fake_trainer, sig):
    command, log = fake_trainer
    spec_path = _write(tmp_path, "base: base.yaml\nlags: [1]\nseeds: 2\ncells: {a: {sleep: 60}}\n")
    out = tmp_path / "out"
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import signal, sys
        # a shell without job control starts background jobs with SIGINT ignored, and Python then keeps it
        # ignored: restore the default so the test sees the runner's own handling wherever it runs
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from satrl.experiments.grid import default_command, load_grid, run_grid_spec
        def command(run, resume):
            return [sys.executable, {str(tmp_path / "fake_train.py")!r}, *default_command(run, resume)[4:]]
        res = run_grid_spec(load_grid({str(spec_path)!r}), {str(out)!r}, workers=2, command_fn=command,
                            progress=False)
        sys.exit(res.exit_code)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    status = {}
    while time.time() < deadline:
        p = out / "grid_status.json"
        status = json.loads(p.read_text()) if p.exists() else {}
        pids_written = all((out / f"a/lag1/seed{s}/pid").exists() for s in (0, 1))
        if status.get("counts", {}).get("running") == 2 and pids_written:
            break
        time.sleep(0.1)
    assert status.get("counts", {}).get("running") == 2, status
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 130
    status = json.loads((out / "grid_status.json").read_text())
    assert status["counts"] == {"interrupted": 2}
    assert not (out / ".satrl-grid.lock").exists()  # Ctrl-C / SIGTERM release --out for the next grid
    assert (out / "a/lag1/seed0/stdout.log").read_text().startswith("=== satrl grid")
    assert not (out / "a/lag1/seed0/summary.json").exists()
    for seed in (0, 1):  # both children were started, and are gone now
        pid = int((out / f"a/lag1/seed{seed}/pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_cli_dry_run_and_bad_grid(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    path = _write(tmp_path, RUNNER_GRID)
    args = parser.parse_args([str(path), "--dry-run", "--seeds", "1", "--out", str(tmp_path / "o")])
    assert grid_app.run_grid(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[0].startswith("[new] a/lag2/seed0: ") and "seed=0" in out[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("lags: [1]\ncells: {a: {}}\n")
    assert grid_app.run_grid(parser.parse_args([str(bad)])) == 2
    assert "no base config" in capsys.readouterr().err


def test_builtin_grid_runs_are_valid_train_configs():
    """Every run of every shipped grid is accepted by `satrl train`'s config loader (keys, values, presets)."""
    from satrl.config import load_config

    for path in sorted((REPO / "configs" / "grids").glob("*.yaml")):
        for run in expand(load_grid(path), "runs/x", seeds=1):
            cfg = load_config(run.base, [*run.overrides, f"seed={run.seed}", f"out={run.run_dir}"])
            assert cfg.lag.n == run.lag, run.name


def test_seed_order_and_only_filter(tmp_path, capsys):
    """`order: seed` runs seed 0 of every cell and lag before seed 1; --only selects runs by name pattern."""
    import argparse

    from satrl.experiments.spec import select

    (tmp_path / "other.yaml").write_text("{}\n")
    spec = load_grid(_write(tmp_path, GRID + "    order: seed\n"))
    names = [r.name for r in expand(spec, tmp_path / "out")]
    assert names == [
        "grpo/lag1/seed0", "grpo/lag8/seed0", "sat/lag1/seed0", "sat/lag8/seed0", "other/lag0/seed0",
        "grpo/lag1/seed1", "grpo/lag8/seed1", "sat/lag1/seed1", "sat/lag8/seed1", "other/lag0/seed1",
    ]  # fmt: skip
    runs = expand(spec, tmp_path / "out")
    assert [r.name for r in select(runs, ["sat/*", "*/lag1/seed1"])] == [
        "sat/lag1/seed0", "sat/lag8/seed0", "grpo/lag1/seed1", "sat/lag1/seed1", "sat/lag8/seed1"]  # fmt: skip
    assert select(runs, None) == runs and select(runs, ["nope/*"]) == []

    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    path = _write(tmp_path, RUNNER_GRID)
    args = parser.parse_args([str(path), "--dry-run", "--only", "*/seed1", "--seeds", "2", "--out", str(tmp_path / "o")])
    assert grid_app.run_grid(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and all("/seed1: " in line for line in out)
    several = ["--only", "a/*", "*/seed1", "--only", "b/*"]  # several patterns per --only, and repeated
    assert parser.parse_args([str(path), *several]).only == ["a/*", "*/seed1", "b/*"]
    args = parser.parse_args([str(path), "--only", "zzz/*", "--out", str(tmp_path / "o")])
    assert grid_app.run_grid(args) == 2
    assert "matches no run" in capsys.readouterr().err


def test_git_commit_is_the_code_checkout_not_the_cwd(tmp_path, monkeypatch):
    """grid_status.json names the commit of the satrl code that ran the grid, whatever the cwd."""
    monkeypatch.chdir(tmp_path)  # not a git repository
    commit = provenance.git_commit()
    src = Path(provenance.__file__).resolve().parent
    inside = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True)
    if inside.returncode != 0:
        assert commit is None
    else:
        assert commit is not None and commit.removesuffix("+dirty") == inside.stdout.strip()
        # '+dirty' looks at the whole package, not one subpackage: it matches git's view of src/satrl
        changed = subprocess.run(["git", "status", "--porcelain", "-uno", "--", "."], cwd=src, capture_output=True,
                                 text=True).stdout.strip()  # fmt: skip
        assert commit.endswith("+dirty") == bool(changed)


def test_edited_grid_refuses_to_mix_old_and_new_runs(tmp_path, fake_trainer, capsys):
    """Issue 26, item 5: a grid rerun into the same --out with other settings neither skips the old runs as
    done nor rewrites grid.yaml to describe settings they lack; --rerun-changed moves them aside and reruns."""
    import argparse

    command, log = fake_trainer
    grid = RUNNER_GRID.replace("      bad: {fail: true}\n", "")
    out, env = tmp_path / "out", {"FAKE_LOG": str(log)}
    assert run_grid_spec(load_grid(_write(tmp_path, grid)), out, command_fn=command, progress=False, env=env).exit_code == 0
    recorded = (out / "grid.yaml").read_text()
    edited = _write(tmp_path, grid.replace("steps: 6", "steps: 8").replace("a: {offset: 0.3}", "a: {offset: 0.5}"),
                    name="edited.yaml")  # fmt: skip
    with pytest.raises(grid_mod.GridChangedError, match=r"steps: 6 -> 8; offset: 0.3 -> 0.5"):
        run_grid_spec(load_grid(edited), out, command_fn=command, progress=False, env=env)
    assert (out / "grid.yaml").read_text() == recorded and len(read_log(log)) == 4  # nothing ran, nothing rewritten

    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    for extra in ([], ["--dry-run"]):  # the CLI: one line, exit 2, naming what changed and how to go on
        capsys.readouterr()
        assert grid_app.run_grid(parser.parse_args([str(edited), "--out", str(out), *extra])) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "steps: 6 -> 8" in err[0] and "--rerun-changed" in err[0] and "new --out" in err[0]
    assert grid_app.run_grid(parser.parse_args([str(edited), "--out", str(out), "--dry-run", "--rerun-changed"])) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 4 and all(x.startswith("[new] ") for x in shown) and (out / "a/lag2/seed0").exists()

    more_seeds = _write(tmp_path, grid.replace("seeds: 2", "seeds: 3"), name="more.yaml")  # more seeds change no run: allowed
    res = run_grid_spec(load_grid(more_seeds), out, command_fn=command, progress=False, env=env)
    assert res.names("finished") == ["a/lag2/seed2", "b/lag2/seed2"] and len(res.names("skipped")) == 4
    run_grid_spec(load_grid(_write(tmp_path, grid)), out, command_fn=command, progress=False, env=env)
    assert yaml.safe_load((out / "grid.yaml").read_text())["seeds"] == 3  # grid.yaml still covers seed 2

    res = run_grid_spec(load_grid(edited), out, command_fn=command, progress=False, env=env, rerun_changed=True)
    assert res.exit_code == 0 and len(res.names("finished")) == 4
    assert len(read_log(out / "a/lag2/seed0/metrics.jsonl")) == 8 and yaml.safe_load((out / "grid.yaml").read_text())["steps"] == 8
    assert not (out / "a/lag2/seed2").exists()  # beyond this call's seeds, but changed: moved too, not left to lie
    (moved,) = (out / ".replaced").iterdir()
    assert len(read_log(moved / "a/lag2/seed2/metrics.jsonl")) == 6  # the old runs are kept, out of the grid


def test_grid_changes_are_judged_on_what_each_run_recorded(tmp_path):
    """A pinned default or a reformatted value is no change (the run's config.yaml says what it ran with); a
    changed value is; and every committed grid still continues its committed runs (README: rerun continues)."""
    from satrl.experiments.changes import changed_runs

    spec = load_grid(_write(tmp_path, "base: base.yaml\nlags: [2]\nseeds: 1\nsteps: 4\ncells: {a: {train.lr: 1e-5}}\n"))
    out = tmp_path / "out"
    run = out / "a/lag2/seed0"
    run.mkdir(parents=True)
    (out / "grid.yaml").write_text(grid_mod.spec_to_yaml(spec, 1))
    (run / "config.yaml").write_text("steps: 4\ntrain: {lr: 1.0e-05, minibatches: 4}\neval: {k: 8}\n")
    (run / "summary.json").write_text('{"status": "finished"}')
    pinned = "base: base.yaml\nlags: [2]\nseeds: 1\nsteps: 4\ncells: {a: {train.lr: 0.00001, train.minibatches: 4, eval.new_key: 1}}\n"
    assert changed_runs(load_grid(_write(tmp_path, pinned, "pinned.yaml")), out, None)[:2] == ([], [])
    edited = load_grid(_write(tmp_path, pinned.replace("minibatches: 4", "minibatches: 2"), "edited.yaml"))
    assert changed_runs(edited, out, None)[1] == ["train.minibatches: 4 -> 2"]
    for results in sorted((REPO / "docs/results").glob("*/grid.yaml")):
        spec = load_grid(REPO / "configs/grids" / f"{results.parent.name}.yaml")
        assert changed_runs(spec, results.parent, None)[1] == [], results.parent.name
