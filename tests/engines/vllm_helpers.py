"""What the vLLM test files share: whether vLLM is here, whether it must be (``SATRL_REQUIRE_VLLM=1``, set by
``make test-vllm``), the skip mark, and the vLLM processes alive. (A uniquely named module: several test folders
have a conftest.py.)"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("SATRL_REQUIRE_VLLM") == "1"
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here; `make test-vllm` runs these tests")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU: plenty for tiny models


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
