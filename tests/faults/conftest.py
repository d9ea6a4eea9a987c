"""Fault tests reuse the tiny in-process runner of tests/e2e."""

from pathlib import Path

import pytest

from run_helpers import REPO, TINY
from satrl.config import load_config
from satrl.pipeline.orchestrator import train


@pytest.fixture
def tiny_cfg(tmp_path):
    def make(*overrides: str, name: str = "run"):
        return load_config(None, [*TINY, *overrides, f"out={tmp_path / name}"])

    return make


@pytest.fixture
def run_tiny(tiny_cfg):
    def run(*overrides: str, name: str = "run", resume: bool = False) -> Path:
        cfg = tiny_cfg(*overrides, name=name)
        train(cfg, resume=resume)
        return cfg.run_dir()

    return run


__all__ = ["REPO"]
