"""Issue 46, item 9: killing only the torchrun launcher left its data-parallel ranks training. Each rank now
watches its parent (:func:`satrl.training.dp.watch_launcher`, started by the rank :class:`~satrl.training.dp.Watchdog`
under torchrun): when it is gone the rank says so in one line and exits 1."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from run_helpers import REPO
from satrl.training.dp import launcher_gone, watch_launcher

LINE = "satrl train: data parallel: the torchrun launcher (pid {}) is gone; ending this rank"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def test_the_parent_check_compares_the_pid_recorded_at_start():
    assert not launcher_gone(os.getppid())
    assert launcher_gone(os.getpid())  # never this process's parent: as if the launcher had died


def test_a_live_launcher_is_watched_until_stopped():
    stop = threading.Event()
    watcher = threading.Thread(target=watch_launcher, args=(os.getppid(), stop, 0.01))
    watcher.start()
    time.sleep(0.1)  # several checks, each finding the parent in place
    stop.set()
    watcher.join(5)
    assert not watcher.is_alive()


def test_a_gone_launcher_ends_the_rank_in_one_line():
    """A fake launcher pid (not this process's parent) reads as a launcher that died: exit 1, one line."""
    fake = os.getppid()  # the child's parent is this process (os.getpid()), never its parent
    code = (f"import threading; from satrl.training.dp import watch_launcher; "
            f"watch_launcher({fake}, threading.Event(), 0.05); print('not ended')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env={**ENV, "RANK": "3"}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 1 and "not ended" not in done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(LINE.format(fake)) and "rank 3" in lines[0], done.stderr


RANK = """
import sys, time
from pathlib import Path
from satrl.training import dp
job = dp.init("cpu")
Path(sys.argv[1], f"ready-{job.rank}").write_text(str(__import__("os").getpid()))
time.sleep(300)  # training, as far as the launcher can tell
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for a non-reaping init has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a torchrun job of 2 ranks: about 20 s on 2 cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilling_the_torchrun_launcher_ends_its_ranks(tmp_path):
    """Two ranks under torchrun; SIGKILL the launcher alone (it cannot end its workers): both ranks end within
    seconds, each with the one line (they sleep 300 s otherwise)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc_per_node=2", str(script), str(tmp_path)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and proc.poll() is None and time.monotonic() < deadline:
            ranks = [int(p.read_text()) for p in sorted(tmp_path.glob("ready-*")) if p.read_text()]
            time.sleep(0.1)
        assert len(ranks) == 2, f"the ranks did not start: {proc.poll()}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        while any(map(_running, ranks)) and time.monotonic() - killed < 15:
            time.sleep(0.1)
        assert not any(map(_running, ranks)), "a rank still trains after its launcher died"
        err = proc.stderr.read()  # the ranks held torchrun's stderr: all of it is in by now
        for pid in ranks:
            mine = [x for x in err.splitlines() if x.startswith(LINE.format(proc.pid)) and f"pid {pid};" in x]
            assert len(mine) == 1, err[-3000:]
    finally:
        for pid in [proc.pid, *ranks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stderr.close()
