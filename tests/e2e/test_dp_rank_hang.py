"""Issue 34, item 5: a SIGSTOPped rank hung a data-parallel job for the control channel's 7 days, silently. Every
rank now beats a heartbeat into torchrun's store and watches the others': a rank that misses
``train.rank_timeout_s`` is named in one line and the job ends non-zero; resuming under torchrun then gives
exactly the uninterrupted run (failed before the fix: the job never ended, the test's timeout killed it)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from run_helpers import DP_ARGS, DP_CONFIG, dp_env, read_jsonl, stable, torchrun

pytestmark = pytest.mark.slow  # two torchrun jobs of 2 ranks and the shared reference: minutes on 2 cores

ENV = dp_env()


def _rank_pid(root: int, rank: int) -> int | None:
    """The pid of the process below ``root`` whose environment says RANK=<rank>."""
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == root and f"RANK={rank}".encode() in env and b"LOCAL_RANK" in b"\0".join(env):
            return pid
    return None


def _ended(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie its launcher has not reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_stopped_rank_is_named_and_the_run_resumes_exactly(tmp_path, shared_dp):
    # the uninterrupted reference is tests/e2e/test_data_parallel.py's 2-rank run: the rank timeout changes no number
    ref = shared_dp(DP_CONFIG, *DP_ARGS)
    out = tmp_path / "hung"
    proc = subprocess.Popen(torchrun(DP_CONFIG, *DP_ARGS, "train.rank_timeout_s=5", out=out), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline, stopped = time.monotonic() + 300, None
    try:
        while time.monotonic() < deadline and proc.poll() is None and stopped is None:
            latest = out / "checkpoints" / "latest"
            if latest.is_file() and latest.read_text().strip() == "step-000002":
                stopped, rank0 = _rank_pid(proc.pid, 1), _rank_pid(proc.pid, 0)
                os.kill(stopped, signal.SIGSTOP)
            time.sleep(0.05)
        assert stopped is not None, "the run ended before rank 1 could be stopped"
        # Rank 0 must name the stopped rank and end. torchrun then SIGTERMs the stopped rank (held pending while it
        # is stopped) and SIGKILLs it only after 30 s (its shutdown grace; --shutdown-timeout does not reach this
        # path): the test kills it as soon as rank 0 has ended, and the job's own exit is what is checked.
        while rank0 is not None and not _ended(rank0) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(stopped, signal.SIGKILL)
        err = proc.communicate(timeout=180)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if stopped is not None:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(stopped, sig)
                except ProcessLookupError:
                    pass
    assert proc.returncode != 0
    named = [x for x in err.splitlines() if x.startswith("satrl train: ")]
    assert len(named) == 1 and "rank 1" in named[0] and f"pid {stopped}" in named[0] and "rank_timeout_s" in named[0], err[-3000:]
    resumed = subprocess.run(torchrun("--resume", out), env=ENV, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(out / "eval.jsonl") == read_jsonl(ref / "eval.jsonl")
