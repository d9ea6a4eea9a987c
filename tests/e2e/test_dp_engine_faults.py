"""Issue 34, item 4: under torchrun with ``weights.transport=dist`` an engine death killed the job (the gloo
error of the broadcast to the dead engine reached rank 0 as torch's ValueError "... not initialized in the world
group map", which the transport did not take for a lost engine). Every engine process now dies at its second
rollout (``SATRL_FAULT=worker.rollout:2``), or hangs there (``SATRL_FAULT_SIGNAL=SIGSTOP``): the run restarts
each one, as on one process, and ends with the metrics and evaluations of the uninterrupted data-parallel run
(the SIGKILL case failed before the fix: exit 1)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import REPO, TINY, read_jsonl, stable

pytestmark = pytest.mark.slow  # three torchrun jobs of 2 ranks and an engine: minutes on 2 cores

TORCHRUN = Path(sys.executable).with_name("torchrun")
ARGS = [*TINY, "steps=6", "lag.n=2", "seed=5", "backend=local", "weights.transport=dist", "lag.inflight_every=2"]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def _dp(out: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "satrl", "train", *ARGS, *extra, f"out={out}",
           "--no-progress"]  # fmt: skip
    return subprocess.run(cmd, env={**ENV, **env}, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "ref"
    ref = _dp(out)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return out


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_dp_run_with_dist_transport_survives_engine_faults(tmp_path, reference, fault):
    """SIGKILL: every engine dies at its second rollout; SIGSTOP: every engine hangs there, and is killed and
    replaced past ``engine.timeout_s`` (the broadcast to it times out too)."""
    extra = ["engine.timeout_s=6"] if fault == "SIGSTOP" else []
    hit = _dp(tmp_path / "hit", *extra, SATRL_FAULT="worker.rollout:2", SATRL_FAULT_SIGNAL=fault)
    assert hit.returncode == 0, hit.stderr[-3000:]
    assert f"engine process {'hung' if fault == 'SIGSTOP' else 'died'}" in hit.stderr and "restarted it" in hit.stderr
    ref = reference
    assert stable(read_jsonl(tmp_path / "hit" / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(tmp_path / "hit" / "eval.jsonl") == read_jsonl(ref / "eval.jsonl")
