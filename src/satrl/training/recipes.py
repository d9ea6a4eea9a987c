"""What ``satrl pretrain --model NAME`` means: the recipe of each built-in policy. A module of its own, importing
nothing heavy, so that ``satrl pretrain --help`` lists the names without importing torch."""

from __future__ import annotations

from typing import Any

from satrl.registry import Registry

__all__ = ["RECIPES"]

# CLI flags override kind, task, digits and ops; model_cfg
# overrides the tiny model's config). The countdown bases need 256 positions (prompt <= 16 + trace <= 240 tokens,
# satrl.tasks.countdown_trace.CONTEXT); the arithmetic ones keep the 64 they shipped with.
_LONG = {"max_position_embeddings": 256}
RECIPES: Registry[dict[str, Any]] = Registry("pretrain recipe", {
    "tiny-arith": {"kind": "dense", "task": "arithmetic", "digits": 3, "ops": "+"},
    "tiny-arith-moe": {"kind": "moe", "task": "arithmetic", "digits": 3, "ops": "+"},
    "tiny-countdown": {"kind": "dense", "task": "countdown_trace", "model_cfg": _LONG},
    "tiny-countdown-moe": {"kind": "moe", "task": "countdown_trace", "model_cfg": _LONG},
})
