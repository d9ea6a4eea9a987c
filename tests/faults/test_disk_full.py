"""Disk full, on a real small filesystem (a tmpfs; tests run as root): the run stops with one line and a
non-zero exit, its last checkpoint intact; after space is freed, --resume gives the uninterrupted metrics.

The run that meets the full disk is a process of its own (it is stopped while the disk fills), forked from a
process that has imported satrl once (run_helpers.ForkedCli), shared by the module's cases; the resume runs in
this process (``satrl.cli.main``): no fresh interpreter's imports for either."""

import os
import signal
import subprocess
import time

import pytest

from run_helpers import TINY, ForkedCli, read_jsonl, stable
from satrl.rundir.files import RunState
from satrl.training.checkpoint import latest_checkpoint, load_checkpoint
from satrl.types import Sample

ARGS = ["steps=8", "lag.schedule=broadcast", "lag.n=2", "seed=4"]


@pytest.fixture(scope="module")
def forked():
    yield ForkedCli
    ForkedCli.stop_server()  # it holds torch's memory until this test process ends otherwise


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt, leave: int) -> None:
    """Fill the filesystem until only ``leave`` bytes are free (0: until a write fails)."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "filler", "wb", buffering=0) as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            while leave == 0:
                f.write(b"\0" * 4096)
        except OSError:  # full
            pass


@pytest.mark.parametrize("where, every, stop_at, leave", [("checkpoint", 1, 3, 256 * 1024), ("metrics", 2, 5, 0)])
def test_disk_full_then_resume(run_tiny, tmpfs, tmp_path, forked, capfd, where, every, stop_at, leave):
    ref = run_tiny(*ARGS, f"checkpoint.every={every}", name="ref")
    out = tmpfs / "run"
    argv = ["train", *TINY, *ARGS, f"checkpoint.every={every}", f"out={out}", "--no-progress"]
    proc = forked(argv, {}, tmp_path / "stderr.txt")  # its stderr off the filesystem that fills
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(read_jsonl(out / "metrics.jsonl")) >= stop_at if (out / "metrics.jsonl").exists() else False:
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        proc.wait()
        pytest.fail(f"run ended before the disk filled: {proc.stderr.read().decode()[-2000:]}")
    os.kill(proc.pid, signal.SIGSTOP)  # fill while it waits, so its very next writes meet a full disk
    _fill(tmpfs, leave)
    os.kill(proc.pid, signal.SIGCONT)
    rc = proc.wait(timeout=300)
    err = proc.stderr.read().decode()
    ours = [x for x in err.splitlines() if x.startswith("satrl train:")]
    assert rc != 0 and "Traceback" not in err, err[-3000:]
    assert len(ours) == 1 and "disk full" in ours[0] and where in ours[0], err[-3000:]
    assert not (out / "summary.json").exists()
    last = latest_checkpoint(out / "checkpoints")
    assert last is not None
    load_checkpoint(last, {"RunState": RunState, "Sample": Sample})  # the previous checkpoint is intact

    (tmpfs / "filler").unlink()
    from satrl import cli

    capfd.readouterr()
    rc = cli.main(["train", "--resume", str(out), "--no-progress"])
    assert rc == 0, capfd.readouterr().err[-2000:]
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
