"""One test per run-folder failure of issue 34 (each failed before its fix): resume validates the whole folder
(config.yaml complete and equal to what the checkpoint was trained with, checkpoint files present and matching
their recorded checksums) before it touches any file (1, 2, 10); a refused resume keeps its logs and gives advice
that keeps the run's length (6); an extended run equals one longer run, evaluations and summary included (7)."""

import json
import shutil

import pytest

from run_helpers import folder_tree, read_jsonl, refused_resume, stable
from satrl.loop.orchestrator import train
from satrl.provenance import read_sessions
from satrl.rundir.files import RunDir

LAGGED = ("lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=5")

_tree, _refused = folder_tree, refused_resume


@pytest.fixture
def finished(shared_tiny):
    """A finished 4-step tiny run (2 optimizer steps per batch), copied fresh for each test by ``copy``."""
    return shared_tiny("steps=4", *LAGGED)


@pytest.fixture
def copy(finished, tmp_path):
    def make():
        out = tmp_path / "run"
        shutil.copytree(finished, out)
        return out

    return make


# -- 1: an empty or edited config.yaml never resumes on other settings ---------------------------------------
def test_empty_config_yaml_is_refused(copy):
    out = copy()
    (out / "config.yaml").write_text("")
    line = _refused(out, "steps=6")
    assert "config.yaml" in line and "seed" in line


def test_edited_config_yaml_is_refused(copy):
    out = copy()
    text = (out / "config.yaml").read_text()
    assert "lr: 0.0001" in text
    (out / "config.yaml").write_text(text.replace("lr: 0.0001", "lr: 0.001"))
    line = _refused(out)
    assert "config.yaml" in line and "train.lr" in line and "step-000004" in line


# -- 10: a resume that changes what the run was trained with is refused; what it may change is recorded -------
def test_resume_changing_the_method_is_refused(copy):
    line = _refused(copy(), "seed=9", "objective.name=grpo")
    assert "seed" in line and "objective.name" in line and "out=" in line


def test_allowed_change_is_recorded_with_its_step(copy):
    out = copy()
    train(RunDir.config_of(out, ["steps=6", "eval.every=2"]), resume=True)
    last = read_sessions(out)[-1]
    assert last["from_step"] == 4 and last["config_changes"] == {"eval.every": [0, 2], "steps": [4, 6]}
    assert "steps: 6" in (out / "config.yaml").read_text()


# -- 2: missing or damaged checkpoint files never wipe the logs ----------------------------------------------
def test_missing_model_files_never_wipe_the_logs(copy):
    out = copy()
    for p in (out / "checkpoints").glob("step-*/model.safetensors"):
        p.unlink()
    line = _refused(out, "steps=6")
    assert "model.safetensors" in line


def test_checkpoints_deleted_from_a_finished_run_are_refused(copy):
    out = copy()
    for p in (out / "checkpoints").glob("step-*"):
        shutil.rmtree(p)
    assert "no checkpoint is left" in _refused(out)  # latest names a checkpoint that is gone (issue 46, item 9)
    (out / "checkpoints" / "latest").unlink()
    assert "summary.json" in _refused(out)  # no pointer either: a finished run without checkpoints


def test_flipped_block_in_the_weights_is_refused(copy):
    out = copy()
    weights = out / "checkpoints" / "step-000004" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)  # a block of zeros inside the tensor data
    weights.write_bytes(bytes(data))
    line = _refused(out)
    assert str(weights.parent) in line and "model.safetensors" in line and "checksum" in line


# -- 6: a refused resume keeps the logs of the steps after its checkpoint, and its advice keeps the run's length --
def test_refused_resume_keeps_logs_and_advises_the_runs_own_steps(tmp_path, tiny_cfg):
    cfg = tiny_cfg("steps=8", *LAGGED, "checkpoint.every=2", name="killed")

    def die(step, metrics, result):
        if step == 6:
            raise KeyboardInterrupt  # killed after step 6; the last checkpoint is at step 4

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=die)
    out = cfg.run_dir()
    assert len(read_jsonl(out / "metrics.jsonl")) == 6
    line = _refused(out, "steps=2")
    assert "already at step 4" in line and "resume with steps=8" in line  # not steps=4: the run's length stays


# -- 7: extending a finished run gives what one longer run gives ----------------------------------------------
def test_extended_run_equals_a_longer_run_evaluations_and_summary(tmp_path, shared_tiny, copy):
    ref = shared_tiny("steps=6", *LAGGED)
    out = copy()
    train(RunDir.config_of(out, ["steps=6"]), resume=True)
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(out / "eval.jsonl") == read_jsonl(ref / "eval.jsonl")
    got, want = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert {k: v for k, v in got.items() if k != "wall_time_s"} == {k: v for k, v in want.items() if k != "wall_time_s"}

