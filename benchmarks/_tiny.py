"""What the fault and golden benchmarks share: the tiny run's settings and how to read its logs stably."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["train.prompts_per_batch=4", "train.group_size=4", "train.minibatches=2", "train.threads=1",
        "engine.max_new_tokens=5", "eval.val_problems=2", "eval.test_problems=2", "eval.k=2", "checkpoint.every=1",
        "backend=sequential"]  # fmt: skip
VOLATILE = ("wall_s", "perf/")


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def read_stable(path: Path) -> list[dict]:
    from satrl.jsonl import read_jsonl

    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_jsonl(path)]
