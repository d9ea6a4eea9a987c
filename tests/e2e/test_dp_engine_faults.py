"""Issue 34, item 4: under torchrun with ``weights.transport=dist`` an engine death killed the job (the gloo
error of the broadcast to the dead engine reached rank 0 as torch's ValueError "... not initialized in the world
group map", which the transport did not take for a lost engine). In one run the first engine process hangs at its
second rollout (``SATRL_FAULT=worker.rollout:2``) and every later one dies there (``SATRL_FAULT_SIGNAL=SIGSTOP,
SIGKILL``, see satrl.faults.spawned): the run restarts each one, as on one process, and ends with the metrics and
evaluations of the uninterrupted data-parallel run (the death failed before the fix: exit 1). The run is run_helpers.DP_DIST_ARGS's: evaluations at steps
0, 3 and 6, versions switched in flight."""

import subprocess
from pathlib import Path

import pytest

from run_helpers import DP_CONFIG, DP_DIST_ARGS, dp_env, read_jsonl, stable, torchrun

pytestmark = pytest.mark.slow  # a torchrun job of 2 ranks and an engine, and the shared reference: minutes


def _dp(out: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun(DP_CONFIG, *DP_DIST_ARGS, *extra, out=out), env=dp_env(**env), capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture
def reference(shared_dp):
    """The uninterrupted data-parallel run (shared with tests/pipeline/test_weight_transport.py, which compares it
    with one process)."""
    return shared_dp(DP_CONFIG, *DP_DIST_ARGS)


def test_dp_run_with_dist_transport_survives_engine_faults(tmp_path, reference):
    """The first engine hangs at its second rollout (SIGSTOP), and is killed and replaced past ``engine.timeout_s``
    (the broadcast to it times out too); its replacements die there (SIGKILL). One job suffers both faults: a
    torchrun job of 2 ranks and an engine costs ~40 s of CPU, a second one for the other fault would repeat all of
    it. The hang comes first, so that a false hang (below) cannot take the place of the death. The hang waits
    that deadline out twice, so it is short: 4 s, where a healthy engine's rollout of this tiny run takes
    well under 3 s on a loaded 2-core machine (measured at load 9-11: the run restarted its engines exactly twice, as
    at 6 s). A false hang would only restart a healthy engine, and re-issue its batch to the same numbers."""
    hit = _dp(tmp_path / "hit", "engine.timeout_s=4", SATRL_FAULT="worker.rollout:2",
              SATRL_FAULT_SIGNAL="SIGSTOP,SIGKILL")  # fmt: skip
    assert hit.returncode == 0, hit.stderr[-3000:]
    assert "engine process hung" in hit.stderr and "engine process died" in hit.stderr, hit.stderr[-3000:]
    assert "restarted it" in hit.stderr
    ref = reference
    assert stable(read_jsonl(tmp_path / "hit" / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(tmp_path / "hit" / "eval.jsonl") == read_jsonl(ref / "eval.jsonl")
