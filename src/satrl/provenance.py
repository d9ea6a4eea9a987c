"""Where and with what a run ran: the code's commit and the machine kind, saved beside every run.

Bits depend on the machine as well as the code: torch picks its fp32 kernels by CPU (vendor and instruction set),
so the same command on the same commit gives last-digit differences on an AMD EPYC and on an Intel Xeon from the
first step on, and, through sampling, different trajectories later (docs/results/sat_trial, protocol Deviations).
A run therefore records, in ``environment.json``, one entry per session that trained it (a resumed run can
continue on another machine): the step it started from, the commit, the CPU kind and the library versions.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import satrl
from satrl.jsonl import loads

ENVIRONMENT = "environment.json"


BUILD_COMMIT = Path(__file__).resolve().parent / "BUILD_COMMIT"  # written by the wheel's build (build_backend/)


def git_commit() -> str | None:
    """The commit of the satrl code that runs (not of the cwd), '+dirty' if the package's tracked files differ
    from it (results and docs elsewhere in the checkout do not count). Outside a git checkout (an installed
    wheel) the commit its build recorded (``BUILD_COMMIT``); None if neither."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno", "--", "."], cwd=here, capture_output=True,
                               text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        head = dirty = None
    if head is not None and head.returncode == 0 and head.stdout.strip():
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    try:
        return BUILD_COMMIT.read_text().strip() or None
    except OSError:
        return None


def cpu_kind(cpuinfo: str | None = None) -> dict:
    """The CPU's vendor and model name from /proc/cpuinfo (``None`` for what it lacks, e.g. off Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    info: dict = {"vendor": None, "model": None}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        field = {"vendor_id": "vendor", "model name": "model"}.get(key.strip())
        if field and info[field] is None:
            info[field] = value.strip()
    return info


def _version(dist: str) -> str | None:
    """An installed distribution's version, None where it is absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def machine_kind() -> dict:
    """What decides this machine's bits: CPU vendor, model name and ``capability``, the vector kernels torch picks
    (``AVX2``, ``AVX512``, ...; two "AMD EPYC" machines with and without AVX-512 differ in fp32's last digits)."""
    import torch  # here, not at the top: `satrl --version` reads this module's commit without torch

    return {**cpu_kind(), "capability": torch.backends.cpu.get_cpu_capability()}


def environment(threads: int) -> dict:
    """This process's code and machine: what a run's bits depend on."""
    import torch

    return {
        "git_commit": git_commit(),
        "satrl": satrl.__version__,
        "cpu": machine_kind(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),  # its model code is the trainer's numerics (5.25 changed defaults)
        "python": platform.python_version(),
        "platform": sys.platform,
        "threads": threads,
    }


def record_session(run_path: Path, from_step: int, threads: int, config_changes: dict | None = None) -> dict:
    """Append this session (the step it starts from, the time, :func:`environment`, and the config changes a
    resume made, ``{key: [before, now]}``, in effect from that step) to the run's ``environment.json``; a fresh
    run (``from_step`` 0) starts the list over. Returns the entry."""
    path = Path(run_path) / ENVIRONMENT
    sessions = read_sessions(run_path) if from_step > 0 else []  # a torn file reads as []: keep what is known now
    entry = {"from_step": from_step, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **environment(threads)}
    if config_changes:
        entry["config_changes"] = config_changes
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"sessions": [*sessions, entry]}, indent=1) + "\n")
    tmp.replace(path)
    return entry


def read_sessions(run_path: Path) -> list[dict]:
    """The sessions a run's ``environment.json`` records ([] for a run from before it existed)."""
    path = Path(run_path) / ENVIRONMENT
    try:
        return loads(path.read_text()).get("sessions", []) if path.is_file() else []
    except (OSError, ValueError):
        return []


def machine_label(sessions: list[dict]) -> str | None:
    """The CPU kinds a run's sessions ran on, in order, e.g. ``"GenuineIntel Intel(R) Xeon(R) Processor (AVX512)"``
    (torch's kernel capability in brackets where the session recorded it; several joined by ``" then "``); None
    for a run without ``environment.json``."""
    kinds = []
    for s in sessions:
        cpu = s.get("cpu") or {}
        kind = " ".join(str(x) for x in (cpu.get("vendor"), cpu.get("model")) if x) or "unknown CPU"
        kinds.append(kind + (f" ({cpu['capability']})" if cpu.get("capability") else ""))
    return _in_order(kinds)


def commit_label(sessions: list[dict]) -> str | None:
    """The code commits a run's sessions ran at, in order, each as its first 8 hex digits (``+dirty`` kept), e.g.
    ``"f2d37b11"`` or ``"0f49d580 then 26c61ebf"`` for a run resumed on another commit; None for a run whose
    sessions recorded none."""
    commits = [s.get("git_commit") for s in sessions]
    return _in_order(f"{c[:8]}{'+dirty' if c.endswith('+dirty') else ''}" for c in commits if isinstance(c, str) and c)


def _in_order(labels: Iterable[str]) -> str | None:
    """The labels of a run's sessions, a repeat of the one before dropped, joined by ``" then "``; None if none."""
    out: list[str] = []
    for label in labels:
        if not out or out[-1] != label:
            out.append(label)
    return " then ".join(out) or None
