"""What the vLLM test files share: whether vLLM is here, whether it must be (``SATRL_REQUIRE_VLLM=1``, set by
``make test-vllm``), the skip mark, and the vLLM processes alive. (A uniquely named module: several test folders
have a conftest.py.)"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from run_helpers import REPO, TINY, read_jsonl

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("SATRL_REQUIRE_VLLM") == "1"
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here; `make test-vllm` runs these tests")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU: plenty for tiny models


# The end-to-end training runs on vLLM (test_vllm_train.py, test_vllm_runs.py): weight sync at lag 2, then backend=...
VLLM_TRAIN = (str(REPO / "configs" / "sat_grpo.yaml"), *TINY, "engine=vllm", "steps=4", "lag.n=2")


def check_vllm_run(out: Path) -> list[dict]:
    """The metrics of a finished ``VLLM_TRAIN`` run in ``out``, after checking what every such run shows."""
    rows = read_jsonl(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert max(row["lag/max"] for row in rows) >= 1  # batch 2 came after a weight sync
    # step 1 is at lag 0: d is pure implementation mismatch (bf16-weights engine vs fp32 trainer): small, real
    assert 0 < rows[0]["mismatch/d_pi"] < 0.02 and all(math.isfinite(row["loss"]) for row in rows)
    print(f"{out.name}: d_pi at lag 0 (step 1) = {rows[0]['mismatch/d_pi']:.2e}")
    assert json.loads((out / "summary.json").read_text())["steps"] == 4 and (out / "eval.jsonl").read_text().strip()
    assert "name: vllm" in (out / "config.yaml").read_text()
    return rows


def vllm_pids(tag: str | None = None) -> set[int]:
    """Processes vLLM names after itself (``VLLM::EngineCore``, ``VLLM::Worker``); with ``tag``, only those whose
    environment holds ``SATRL_TEST_TAG=<tag>`` (inherited from the command a test started with it), so that the
    vLLM processes of another test running at the same time (pytest-xdist) or of another job are not counted."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"VLLM::"):
                if tag is None or f"SATRL_TEST_TAG={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    pids.add(int(proc.name))
        except OSError:
            pass
    return pids


@contextlib.contextmanager
def in_process_vllm():
    """Keyword arguments for ``VLLMEngine`` that start vLLM's engine core and its worker in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while it starts, the ``uni`` executor): no spawned process imports torch and
    vLLM again, which is most of an engine's start on 2 cores (two spawned processes; about 5x the wall time of an
    in-process start under load). For the tests of what the engine computes; the processes vLLM runs in a real run,
    and their shutdown, are what the end-to-end runs check (test_vllm_train.py, test_vllm_runs.py). This process's
    environment, vLLM's cache of it, and the CPU affinity are restored afterwards, so a later subprocess or engine
    starts as it would have."""
    import vllm.envs

    before, affinity = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), os.sched_getaffinity(0)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield {"distributed_executor_backend": "uni"}
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
        vllm.envs.disable_envs_cache()  # the in-process engine core cached the environment as it was at its start
        os.sched_setaffinity(0, affinity)
