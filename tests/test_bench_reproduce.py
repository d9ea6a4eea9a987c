"""benchmarks/reproduce.py: a finished run rerun from its saved config reproduces bit for bit; a changed number is
named with its step; a shorter rerun compares evaluations only before its own late window."""

import json
import shutil
import subprocess
import sys

import pytest
from benchmarks import reproduce
from benchmarks._tiny import TINY, env

from run_helpers import REPO

M = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]  # rows as read_stable reads them: timings already dropped


def test_first_difference_by_hand():
    assert reproduce.first_difference(M, [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}], "metrics", None) is None
    why = reproduce.first_difference(M, [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.5, "b": 0}], "metrics", None)
    assert why == "metrics at step 2: a recorded 2.0, now 2.5 (2 keys differ)"  # a, and b which is new
    assert reproduce.first_difference(M, [{"step": 1, "a": 1.0}, {"step": 2, "a": 7.0}], "eval", 2) is None  # before 2
    assert reproduce.first_difference(M, [{"step": 5}], "eval", None) == "eval: no step in common"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny GRPO run of 4 steps with evaluations at 0, 2 and 4 (seconds on 2 cores)."""
    out = tmp_path_factory.mktemp("run") / "grpo"
    cmd = [sys.executable, "-m", "satrl", "train", str(REPO / "configs" / "grpo.yaml"), *TINY, "steps=4",
           "eval.every=2", "seed=1", "checkpoint.every=100", f"out={out}", "--no-progress"]  # fmt: skip
    subprocess.run(cmd, env=env(OMP_NUM_THREADS="1"), check=True, capture_output=True)
    return out


@pytest.mark.slow
def test_a_run_reproduces_and_a_changed_number_is_named(run, tmp_path, capsys):
    assert reproduce.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "reproduce: reproduced: 4 optimizer steps' metrics and 3 evaluations bit for bit" in out
    assert "4 of 4 steps rerun" in out and "warning" not in out
    bad = tmp_path / "bad"
    shutil.copytree(run, bad, ignore=shutil.ignore_patterns("checkpoints"))
    rows = [json.loads(x) for x in (bad / "metrics.jsonl").read_text().splitlines()]
    rows[2]["train/reward"] += 1e-9  # the last bit of one number of step 3
    (bad / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env_json = json.loads((bad / "environment.json").read_text())
    env_json["sessions"][0]["cpu"] = {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R)", "capability": "AVX2"}
    (bad / "environment.json").write_text(json.dumps(env_json))
    assert reproduce.main([str(bad), "--steps", "3", "--out", str(tmp_path / "again")]) == 1
    out = capsys.readouterr().out
    assert "reproduce: DIFFERS: metrics at step 3: train/reward recorded" in out
    assert "warning: another CPU kind recorded this run" in out and "Intel(R) Xeon(R) AVX2" in out
    assert (tmp_path / "again" / "checkpoints").is_dir()  # --out keeps the rerun, checkpoints and all


def test_bad_input_exits_2(tmp_path, capsys):
    assert reproduce.main([str(tmp_path)]) == 2 and "no config.yaml" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("steps: 4\n")
    assert reproduce.main([str(tmp_path), "--steps", "0"]) == 2 and "--steps 0" in capsys.readouterr().err
