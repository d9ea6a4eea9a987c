"""Issue 60: a run that fails at start-up (before its first step) leaves no ``out=`` folder that blocks a retry
with the same ``out=``, and a ``--resume`` of a run without a checkpoint refuses what a resume may not change.

Before the fix the failed start left ``config.yaml``: the retry without the bad setting was refused ("already
holds a run"), and ``--resume DIR model.path=null`` trained a run that config.yaml did not record.
"""

import yaml

from run_helpers import TINY
from satrl.cli import main
from satrl.config import load_config


def _train(out, *overrides: str) -> int:
    return main(["train", *TINY, "steps=2", *overrides, f"out={out}", "--no-progress"])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_failed_start_leaves_no_folder_and_retry_works(tmp_path, capsys):
    out = tmp_path / "np"
    assert _train(out, "model.path=/nonexistent") == 2
    assert "/nonexistent" in _one_line(capsys)
    assert not out.exists()  # the folder it made is gone: nothing blocks the retry
    assert _train(out) == 0
    assert (out / "summary.json").is_file()


def test_failed_start_with_missing_dataset_keeps_an_empty_folder_of_the_user(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()  # the user's own empty folder: emptied again, not removed
    missing = tmp_path / "absent.jsonl"
    assert _train(out, "task.name=jsonl_math", f"task.kwargs.path={missing}") == 2
    assert "absent.jsonl" in _one_line(capsys)
    assert out.is_dir() and list(out.iterdir()) == []
    assert _train(out) == 0


def _unstarted(tmp_path, *overrides: str):
    """A run folder as a run killed before its first checkpoint leaves it: its resolved config.yaml only."""
    out = tmp_path / "killed"
    out.mkdir()
    cfg = load_config(None, [*TINY, "steps=2", *overrides, f"out={out}"])
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return out


def test_resume_without_checkpoint_refuses_a_change_it_may_not_make(tmp_path, capsys):
    out = _unstarted(tmp_path, "model.path=/nonexistent")  # left by a failed start before the fix
    before = (out / "config.yaml").read_text()
    assert main(["train", "--resume", str(out), "model.path=null", "--no-progress"]) == 2
    line = _one_line(capsys)
    assert "model.path" in line and "resume may change only" in line
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml"]
    assert (out / "config.yaml").read_text() == before


def test_resume_without_checkpoint_records_an_allowed_change(tmp_path):
    out = _unstarted(tmp_path)
    assert main(["train", "--resume", str(out), "steps=4", "--no-progress"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 4
