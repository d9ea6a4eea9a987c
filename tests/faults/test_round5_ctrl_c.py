"""Issue 60: Ctrl-C is one line and no traceback in every process and phase. A terminal's Ctrl-C reaches the
whole foreground process group: the engine process of ``backend=local`` printed a KeyboardInterrupt traceback
(2 tries in 3), and a Ctrl-C while a command imported its modules was a traceback too."""

import os
import signal
import subprocess
import sys
import time

import pytest

from run_helpers import REPO, TINY
from satrl import cli

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    def importing(command):
        raise KeyboardInterrupt  # as if Ctrl-C came while `satrl report` imported its module

    monkeypatch.setattr(cli, "program", importing)
    assert cli.main(["report", "runs/x"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["satrl: interrupted"]


def _interrupted(tmp_path, ready) -> tuple[int, str]:
    """``satrl train`` (local engine process) in a session of its own; once ``ready(out)``, SIGINT to its whole
    process group, as a terminal's Ctrl-C; its exit code and stderr."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "satrl",
        "train",
        *TINY,
        "steps=40",
        "backend=local",
        f"out={out}",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not ready(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def _steps(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.parametrize("phase", ["importing", "training"])
def test_ctrl_c_to_the_process_group_is_one_line(tmp_path, phase):
    start = time.monotonic()  # importing: past the interpreter's own start-up, before torch is in (seconds)
    ready = (
        (lambda out: time.monotonic() - start > 1.0)
        if phase == "importing"
        else (lambda out: _steps(out) >= 2)
    )
    rc, err = _interrupted(tmp_path, ready)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert len(lines) == 1 and "interrupted" in lines[0], lines
