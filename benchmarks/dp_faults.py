"""Data-parallel faults for the chaos suite (issue 34): each case runs `torchrun --nproc_per_node=2 -m satrl train`
on the tiny policy with ``backend=local weights.transport=dist lag.inflight_every=2``, breaks it, and checks that
the run ends with exactly the metrics and evaluations of the unbroken data-parallel run.

    python -m benchmarks.dp_faults          # these cases alone (several minutes on 2 cores)

Cases: every engine process SIGKILLed at its second rollout (restarted, as on one process); every engine
SIGSTOPped there (killed and replaced past ``engine.timeout_s``); rank 1 SIGSTOPped after a checkpoint (named in
one line within ``train.rank_timeout_s``, the job ends, ``--resume`` under torchrun finishes it).
:func:`dp_faults` returns ``{"tried": n, "identical": m}``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._tiny import TINY, env, read_stable

ARGS = [*TINY, "steps=6", "lag.n=2", "seed=5", "backend=local", "weights.transport=dist", "lag.inflight_every=2",
        "train.rank_timeout_s=5"]  # fmt: skip
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _cmd(*args: str) -> list[str]:
    return [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "satrl", "train", *args, "--no-progress"]


def _run(out: Path, *extra: str, **fault: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(*ARGS, *extra, f"out={out}"), env={**env(OMP_NUM_THREADS="1"), **fault},
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def _same(out: Path, ref: Path) -> bool:
    return read_stable(out / "metrics.jsonl") == read_stable(ref / "metrics.jsonl") and (
        read_stable(out / "eval.jsonl") == read_stable(ref / "eval.jsonl"))  # fmt: skip


def _rank_pid(root: int, rank: int) -> int | None:
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == root and f"RANK={rank}".encode() in environ:
            return pid
    return None


def _rank_stopped(out: Path) -> str | None:
    """SIGSTOP rank 1 once checkpoint step 2 exists: the job must end non-zero naming it; then resume."""
    proc = subprocess.Popen(_cmd(*ARGS, f"out={out}"), env=env(OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    stopped, deadline = None, time.monotonic() + 600
    try:
        while stopped is None and proc.poll() is None and time.monotonic() < deadline:
            latest = out / "checkpoints" / "latest"
            if latest.is_file() and latest.read_text().strip() == "step-000002":
                stopped = _rank_pid(proc.pid, 1)
                if stopped is not None:
                    os.kill(stopped, signal.SIGSTOP)
            time.sleep(0.05)
        err = proc.communicate(timeout=300)[1] if stopped is not None else ""
    except subprocess.TimeoutExpired:
        return "the job did not end after rank 1 stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for sig in (signal.SIGKILL, signal.SIGCONT) if stopped is not None else ():
            try:
                os.kill(stopped, sig)
            except ProcessLookupError:
                pass
    if stopped is None:
        return "the run ended before rank 1 could be stopped"
    if proc.returncode == 0 or f"rank 1 (pid {stopped})" not in err:
        return f"exit {proc.returncode}, stderr: {err.strip()[-300:]!r}"
    done = subprocess.run(_cmd("--resume", str(out)), env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    return None if done.returncode == 0 else f"resume exit {done.returncode}: {done.stderr.strip()[-300:]!r}"


def dp_faults(work: Path, log=print) -> dict:
    """Every case on its own run, each compared with one unbroken run: ``{"tried": n, "identical": m}``."""
    ref = work / "ref"
    done = _run(ref)
    if done.returncode != 0:
        log(f"not clean: the unbroken data-parallel run failed: {done.stderr.strip()[-300:]!r}")
        return {"tried": 0, "identical": 0}
    cases = {
        "engine SIGKILLed": lambda d: _run(d, SATRL_FAULT="worker.rollout:2"),
        "engine SIGSTOPped": lambda d: _run(d, "engine.timeout_s=6", SATRL_FAULT="worker.rollout:2",
                                            SATRL_FAULT_SIGNAL="SIGSTOP"),  # fmt: skip
        "rank 1 SIGSTOPped": _rank_stopped,
    }
    identical = 0
    for i, (name, case) in enumerate(cases.items()):
        out = work / f"case{i}"
        result = case(out)
        problem = result if isinstance(result, str) or result is None else (
            None if result.returncode == 0 else f"exit {result.returncode}: {result.stderr.strip()[-300:]!r}")  # fmt: skip
        if problem is None and not _same(out, ref):
            problem = "metrics or evaluations differ from the unbroken run"
        identical += problem is None
        if problem is not None:
            log(f"not clean: {name}: {problem}")
    return {"tried": len(cases), "identical": identical}


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        res = dp_faults(Path(tmp))
    print(f"data-parallel faults {res['tried']} tried / {res['identical']} resumed identical")
    return 0 if res["identical"] == res["tried"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
