"""How far data parallel drifts from one process, per step, on this CPU: the numbers behind the tests' tolerance.

    python -m benchmarks.dp_drift            # ATEN_CPU_CAPABILITY=default and the CPU's own kernels; rewrites
                                             # the "Data-parallel drift" section of docs/benchmarks.md

For each vector-unit setting it trains the tests' tiny run (`tests/e2e/test_data_parallel.py`: 6 steps, broadcast
lag 2, several microbatches per step) once in one process and once under `torchrun --nproc_per_node=2`, and prints
each step's largest relative difference over the logged metrics, apart from the engine's implementation mismatch
(`mismatch/d_impl`, `frac_impl`) and the gradient norm, which are shown on their own. Only the order of the gradient
sums differs between the two, so step 1 is exact but for the gradient norm; `tests/run_helpers.py` (`DP_RTOL`)
derives the tolerance from these numbers. Not a timing: the numbers do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._report import write_section

REPO = Path(__file__).resolve().parent.parent
ARGS = ["train.prompts_per_batch=4", "train.group_size=4", "train.minibatches=2", "train.threads=1",
        "engine.max_new_tokens=5", "eval.val_problems=2", "eval.test_problems=2", "eval.k=2", "checkpoint.every=1",
        "backend=sequential", "steps=6", "lag.n=2", "seed=5", "eval.every=3", "train.microbatch_tokens=40"]  # fmt: skip
IMPL = ("mismatch/d_impl", "mismatch/frac_impl")
SKIP = ("wall_s", "perf/", "step")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


def drift(one: list[dict], dp: list[dict]) -> list[dict]:
    """Per step: the largest relative difference (and its metric) outside IMPL, IMPL's, and the gradient norm's."""
    out = []
    for a, b in zip(one, dp):
        rel = {k: _rel(v, b[k]) for k, v in a.items()
               if isinstance(v, float) and isinstance(b.get(k), float) and not k.startswith(SKIP)}  # fmt: skip
        rest = {k: v for k, v in rel.items() if k not in IMPL and k != "obj/grad_norm"}
        worst = max(rest, key=rest.get) if rest else "-"
        out.append({"step": a["step"], "metric": worst, "rel": rest.get(worst, 0.0),
                    "impl": max((rel.get(k, 0.0) for k in IMPL), default=0.0),
                    "grad_norm": rel.get("obj/grad_norm", 0.0)})  # fmt: skip
    return out


def measure() -> list[dict]:
    """Run both trainings in this process's environment (its ATEN_CPU_CAPABILITY) and return :func:`drift`."""
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    config = REPO / "configs" / "sat_grpo.yaml"
    root = Path(tempfile.mkdtemp(prefix="dp_drift-"))
    train(load_config(config, [*ARGS, f"out={root / 'one'}"]))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "satrl",
           "train", str(config), *ARGS, f"out={root / 'dp'}", "--no-progress"]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return drift(_rows(root / "one" / "metrics.jsonl"), _rows(root / "dp" / "metrics.jsonl"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--here", action="store_true", help="measure once in this process's setting, print JSON")
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    a = p.parse_args()
    if a.here:
        print(json.dumps(measure()))
        return
    lines = ["| vector unit | step | largest rel. diff (metric) | impl. mismatch | grad norm |", "|---|---|---|---|---|"]
    for cap in ("default", ""):  # "" = the CPU's own best kernels
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap} if cap else {k: v for k, v in os.environ.items()
                                                                      if k != "ATEN_CPU_CAPABILITY"}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "benchmarks.dp_drift", "--here"], env=env, cwd=REPO,
                              check=True, capture_output=True, text=True)  # fmt: skip
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            lines.append(f"| {cap or 'native'} | {r['step']} | {r['rel']:.1e} ({r['metric']}) | {r['impl']:.1e} | "
                         f"{r['grad_norm']:.1e} |")  # fmt: skip
    body = "\n".join(lines)
    print(body)
    if not a.no_doc:
        write_section("Data-parallel drift", "python -m benchmarks.dp_drift", body + "\n\nThe tests hold steps >= 2 "
                      "to 1e-3 relative and the implementation mismatch to 5e-3 (`tests/run_helpers.py`, `DP_RTOL`).")


if __name__ == "__main__":
    main()
