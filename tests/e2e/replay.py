"""The replay record: a fixed-seed tiny run of every shipped method config, every metric and eval line kept.

tests/e2e/test_replay.py reruns the same runs and requires bit-identical metrics (timings aside), so a refactor
that is meant to change no behaviour provably changes none. When a change is *meant* to move numbers, regenerate
the record in the same commit and say why in its message:

    .venv/bin/python tests/e2e/replay.py      # rewrites tests/data/replay.json
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run_helpers, when run as a script

from run_helpers import REPO, TINY, read_jsonl, stable  # noqa: E402

RECORD = REPO / "tests" / "data" / "replay.json"
GPU_ONLY = {"qwen3_gpu.yaml"}
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name not in GPU_ONLY)
# 5 steps at broadcast lag 2 with 2 optimizer steps per batch: staleness, clipping and the SAT gate all happen.
OVERRIDES = ["steps=5", "lag.schedule=broadcast", "lag.n=2", "seed=3", "eval.every=2", "diagnostics.decompose=true"]


def _canonical(rows: list[dict]) -> list[dict]:
    """Stable keys only, NaN written as None (so a NaN-to-null change in the log format is not a diff)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in stable(rows)]


def replay(config: str, out: Path) -> dict:
    from satrl.config import load_config
    from satrl.pipeline.orchestrator import train

    cfg = load_config(REPO / "configs" / config, [*TINY, *OVERRIDES, f"out={out}"])
    train(cfg)
    return {"metrics": _canonical(read_jsonl(out / "metrics.jsonl")), "eval": _canonical(read_jsonl(out / "eval.jsonl"))}


def main() -> None:
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in CONFIGS:
            record[config] = replay(config, Path(tmp) / config)
            print(f"{config}: {len(record[config]['metrics'])} steps", flush=True)
    RECORD.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    print(f"wrote {RECORD}")


if __name__ == "__main__":
    main()
