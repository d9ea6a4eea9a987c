"""The run_tiny fixture: train a tiny config in-process into a temporary run directory."""

from pathlib import Path

import pytest

from run_helpers import REPO, TINY
from satrl.config import load_config
from satrl.pipeline.orchestrator import train


@pytest.fixture
def run_tiny(tmp_path):
    def run(*overrides: str, config: str | None = None, name: str = "run") -> Path:
        out = tmp_path / name
        cfg = load_config(REPO / "configs" / config if config else None, [*TINY, *overrides, f"out={out}"])
        train(cfg)
        return out

    return run
