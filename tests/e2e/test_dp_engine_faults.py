"""Issue 34, item 4: under torchrun with ``weights.transport=dist`` an engine death killed the job (the gloo
error of the broadcast to the dead engine reached rank 0 as torch's ValueError "... not initialized in the world
group map", which the transport did not take for a lost engine). Every engine process now dies at its second
rollout (``SATRL_FAULT=worker.rollout:2``), or hangs there (``SATRL_FAULT_SIGNAL=SIGSTOP``): the run restarts
each one, as on one process, and ends with the metrics and evaluations of the uninterrupted data-parallel run
(the SIGKILL case failed before the fix: exit 1). The run is run_helpers.DP_DIST_ARGS's: evaluations at steps
0, 3 and 6, versions switched in flight."""

import subprocess
from pathlib import Path

import pytest

from run_helpers import DP_CONFIG, DP_DIST_ARGS, dp_env, read_jsonl, stable, torchrun

pytestmark = pytest.mark.slow  # two torchrun jobs of 2 ranks and an engine, and the shared reference: minutes


def _dp(out: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun(DP_CONFIG, *DP_DIST_ARGS, *extra, out=out), env=dp_env(**env), capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture
def reference(shared_dp):
    """The uninterrupted data-parallel run (shared with tests/pipeline/test_weight_transport.py, which compares it
    with one process)."""
    return shared_dp(DP_CONFIG, *DP_DIST_ARGS)


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_dp_run_with_dist_transport_survives_engine_faults(tmp_path, reference, fault):
    """SIGKILL: every engine dies at its second rollout; SIGSTOP: every engine hangs there, and is killed and
    replaced past ``engine.timeout_s`` (the broadcast to it times out too). Each hang waits that deadline out
    twice, so it is short: 4 s, where a healthy engine's rollout of this tiny run takes well under 3 s on a loaded
    2-core machine (measured at load 9-11: the run restarted its engines exactly twice, as at 6 s). A false hang
    would only restart a healthy engine, and re-issue its batch to the same numbers."""
    extra = ["engine.timeout_s=4"] if fault == "SIGSTOP" else []
    hit = _dp(tmp_path / "hit", *extra, SATRL_FAULT="worker.rollout:2", SATRL_FAULT_SIGNAL=fault)
    assert hit.returncode == 0, hit.stderr[-3000:]
    assert f"engine process {'hung' if fault == 'SIGSTOP' else 'died'}" in hit.stderr and "restarted it" in hit.stderr
    ref = reference
    assert stable(read_jsonl(tmp_path / "hit" / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(tmp_path / "hit" / "eval.jsonl") == read_jsonl(ref / "eval.jsonl")
