"""Issue 26, item 7: inputs that ended in a traceback (exit 1) where one line and exit 2 were promised: a damaged
checkpoint (truncated or foreign weight files, a state.json of the wrong structure), an unusable ``out=``,
a prompt that cannot fit the model's context with ``engine.max_new_tokens``."""

import pytest
from benchmarks.hostile import BAD_CHECKPOINTS, check_checkpoint

from run_helpers import TINY
from satrl import cli


def _one_line_exit_2(capsys, *argv: str) -> str:
    capsys.readouterr()
    rc = cli.main(list(argv))
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1, (rc, err)
    return err[0]


@pytest.fixture
def finished_run(shared_tiny):
    return shared_tiny("steps=2")  # check_checkpoint damages a copy


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_damaged_checkpoint_is_one_line_exit_2(finished_run, tmp_path, case):
    assert check_checkpoint(finished_run, tmp_path, case) is None


def test_out_under_a_file_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    line = _one_line_exit_2(capsys, "train", *TINY, "steps=1", f"out={tmp_path / 'a_file' / 'run'}", "--no-progress")
    assert "a_file" in line, line


def test_read_only_out_is_one_line_exit_2(tmp_path, capsys):
    """out= where nothing can be written: /sys is read-only even for root (a chmod-ed folder is not)."""
    line = _one_line_exit_2(capsys, "train", *TINY, "steps=1", "out=/sys/satrl-test-run", "--no-progress")
    assert "/sys/satrl-test-run" in line, line


def test_prompt_beyond_the_model_context_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    line = _one_line_exit_2(capsys, "train", *TINY, "steps=1", "engine.max_new_tokens=60", f"out={out}", "--no-progress")
    assert "engine.max_new_tokens=60" in line and "max_position_embeddings=64" in line, line
    assert not list((out / "checkpoints").glob("step-*")), "it trained before refusing"


@pytest.mark.parametrize("backend", ["sequential", "local"])
def test_a_later_prompt_beyond_the_context_is_one_line_exit_2(tmp_path, capsys, monkeypatch, backend):
    """A prompt longer than those checked up front (here: the check is skipped) meets the engine's own check,
    in this process or in the engine process: one line, exit 2."""
    from satrl.loop import orchestrator

    monkeypatch.setattr(orchestrator, "check_context", lambda *a: None)
    line = _one_line_exit_2(capsys, "train", *TINY, "steps=2", "engine.max_new_tokens=60", "eval.at_start=false",
                            f"backend={backend}", f"out={tmp_path / 'run'}", "--no-progress")  # fmt: skip
    assert "max_new_tokens" in line and "context" in line, line
