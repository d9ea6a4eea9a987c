"""The built-in policies: each name and its folder under ``satrl/models/checkpoints/`` (ordinary Hugging Face
directories shipped inside the package). A module of its own, importing nothing heavy, so that ``satrl eval --help``
lists the names from this registry without importing torch or transformers."""

from __future__ import annotations

from pathlib import Path

from satrl.registry import Registry

__all__ = ["BUILTINS", "CHECKPOINTS"]

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
BUILTINS: Registry[str] = Registry("built-in policy", {  # name -> folder under CHECKPOINTS
    "tiny-arith": "tiny-arith",
    "tiny-arith-moe": "tiny-arith-moe",
    "tiny-countdown-moe": "tiny-countdown-moe",  # countdown_trace's base (256 positions; docs/tasks.md)
})
