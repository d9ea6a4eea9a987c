"""Issue 26, item 7: inputs that ended in a traceback (exit 1) where one line and exit 2 were promised: a damaged
checkpoint (truncated or foreign weight files, a state.json of the wrong structure), an unusable ``out=``,
a prompt that cannot fit the model's context with ``engine.max_new_tokens``."""

import json
import shutil

import pytest

from run_helpers import TINY
from satrl import cli


def _one_line_exit_2(capsys, *argv: str) -> str:
    capsys.readouterr()
    rc = cli.main(list(argv))
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1, (rc, err)
    return err[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from satrl.config import load_config
    from satrl.pipeline.orchestrator import train

    out = tmp_path_factory.mktemp("ckpt") / "run"
    train(load_config(None, [*TINY, "steps=2", f"out={out}"]))
    (out / "summary.json").unlink()  # as if killed after its last checkpoint
    return out


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _tree(p):
    return json.loads(p.read_text())


DAMAGE = {
    "model.safetensors truncated": ("model.safetensors", _truncate),
    "model.safetensors not safetensors": ("model.safetensors", lambda p: p.write_text("hello, not a tensor file")),
    "model.safetensors empty": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "state.safetensors truncated": ("state.safetensors", _truncate),
    "state.json a list": ("state.json", lambda p: p.write_text("[1, 2]")),
    "state.json run is a number": ("state.json", lambda p: p.write_text(json.dumps({**_tree(p), "run": 5}))),
    "state.json trainer is a string": ("state.json", lambda p: p.write_text(json.dumps({**_tree(p), "trainer": "x"}))),
    "state.json next_batch a string": ("state.json", lambda p: p.write_text(
        json.dumps(_tree(p)).replace('"next_batch": 1', '"next_batch": "one"'))),
    "state.json not JSON": ("state.json", lambda p: p.write_text("{")),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_checkpoint_is_one_line_exit_2(finished_run, tmp_path, capsys, case):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    name, damage = DAMAGE[case]
    step = (out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip())
    before = (step / name).read_bytes()
    damage(step / name)
    assert (step / name).read_bytes() != before, "the damage did nothing"
    line = _one_line_exit_2(capsys, "train", "--resume", str(out), "--no-progress")
    assert str(step) in line, line


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
    from satrl.pipeline import orchestrator

    monkeypatch.setattr(orchestrator, "check_context", lambda *a: None)
    line = _one_line_exit_2(capsys, "train", *TINY, "steps=2", "engine.max_new_tokens=60", "eval.at_start=false",
                            f"backend={backend}", f"out={tmp_path / 'run'}", "--no-progress")  # fmt: skip
    assert "max_new_tokens" in line and "context" in line, line
