"""The replay record: a fixed-seed tiny run of every shipped method config, every metric and eval line kept.

tests/e2e/test_replay.py reruns the same runs and requires bit-identical metrics (timings aside), so a refactor
that is meant to change no behaviour provably changes none.

Bits depend on the CPU as well as the code: torch picks its fp32 kernels by CPU, so the same commit gives
last-digit differences on an AMD EPYC and on an Intel Xeon from the first step on (and, through sampling,
different trajectories later). The record therefore keeps one run set per machine kind (CPU vendor, model name
and the vector kernels torch picks: two "AMD EPYC" machines, one with AVX-512 and one without, differ in the 6th
digit at step 1, seen 2026-12-04). On a recorded kind the test is exact; on a kind no record covers it can only check the first optimizer
step to a tolerance, and says so.

    .venv/bin/python tests/e2e/replay.py          # a change MEANT to move numbers: record this machine only
    .venv/bin/python tests/e2e/replay.py --add    # an unchanged commit on a new machine kind: add it

Regenerate in the same commit as a change that moves numbers, and say why in its message.
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run_helpers, when run as a script

from run_helpers import REPO, TINY, read_jsonl, stable  # noqa: E402
from satrl.provenance import machine_kind as machine  # noqa: E402  (vendor, model name, torch's kernel capability)

RECORD = REPO / "tests" / "data" / "replay.json"
GPU_ONLY = {"qwen3_gpu.yaml", "qwen3_8b.yaml"}
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name not in GPU_ONLY)
# 5 steps at broadcast lag 2 with 2 optimizer steps per batch: staleness, clipping and the SAT gate all happen.
OVERRIDES = ["steps=5", "lag.schedule=broadcast", "lag.n=2", "seed=3", "eval.every=2", "diagnostics.decompose=true"]


def _family(model: str | None) -> str | None:
    """A CPU model name without its advertised clock (" @ 2.00GHz"): the clock does not choose kernels. Seen on
    2026-12-02: a machine named "Intel(R) Xeon(R) Processor" reran all 13 configs bit for bit against the record
    made on an "Intel(R) Xeon(R) Processor @ 2.00GHz"."""
    return None if model is None else re.sub(r"\s*@\s*[\d.]+\s*[GM]Hz\s*$", "", model)


def covers(recorded: dict, here: dict) -> bool:
    """A recorded machine covers this one if the vendors, the model names (clock aside) and torch's kernel
    capabilities match (a record whose model name was not kept covers every model of its vendor)."""
    model = recorded.get("model")
    return (recorded["vendor"] == here["vendor"] and (model is None or _family(model) == _family(here["model"]))
            and recorded["capability"] == here["capability"])  # fmt: skip


def load_record() -> list[dict]:
    """The recorded machines, each ``{"vendor", "model", "capability", "runs": {config: {"metrics", "eval"}}}``."""
    return json.loads(RECORD.read_text())["machines"]


def _canonical(rows: list[dict]) -> list[dict]:
    """Stable keys only, NaN written as None (so a NaN-to-null change in the log format is not a diff)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in stable(rows)]


def replay(config: str, out: Path) -> dict:
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    cfg = load_config(REPO / "configs" / config, [*TINY, *OVERRIDES, f"out={out}"])
    train(cfg)
    return {"metrics": _canonical(read_jsonl(out / "metrics.jsonl")), "eval": _canonical(read_jsonl(out / "eval.jsonl"))}


def main(argv: list[str]) -> None:
    add = "--add" in argv
    here = machine()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in CONFIGS:
            runs[config] = replay(config, Path(tmp) / config)
            print(f"{config}: {len(runs[config]['metrics'])} steps", flush=True)
    # --add keeps the other kinds' runs (same code, other CPUs); a change meant to move numbers makes them stale.
    kept = [m for m in load_record() if not covers(m, here)] if add and RECORD.exists() else []
    RECORD.write_text(json.dumps({"machines": [*kept, {**here, "runs": runs}]}, indent=0, sort_keys=True) + "\n")
    print(f"wrote {RECORD}: {len(kept) + 1} machine kind(s)")


if __name__ == "__main__":
    main(sys.argv[1:])
