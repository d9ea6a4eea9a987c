"""Fixtures of the engine tests (helpers live in engine_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    return tiny_model("dense")


@pytest.fixture(scope="module")
def moe() -> torch.nn.Module:
    return tiny_model("moe")
