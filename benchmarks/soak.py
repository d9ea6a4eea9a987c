"""Soak: a long run of the real pipeline (local backend), watching resident memory and the snapshot store.

    python -m benchmarks.soak                 # 2,000 steps, writes the result to docs/benchmarks.md
    python -m benchmarks.soak --steps 300     # shorter, prints only

RSS (VmRSS of the trainer process and of the engine process) is sampled after every optimizer step; growth
is the last sample over the one at the end of warm-up (10 % of the steps), minus 1. The snapshot store is
checked after every update: it may hold only versions that a batch not yet trained needs (its ``wanted``
set), and its largest size is reported.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks._report import write_section

TINY = ["train.prompts_per_batch=4", "train.group_size=4", "train.minibatches=2", "train.threads=1",
        "engine.max_new_tokens=5", "eval.val_problems=2", "eval.test_problems=2", "eval.k=2", "eval.every=500", "checkpoint.every=50",
        "lag.schedule=broadcast", "lag.n=4", "objective.name=sat_grpo", "backend=local"]  # fmt: skip


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def soak(steps: int) -> dict:
    from satrl.config import load_config
    from satrl.loop import orchestrator
    from satrl.weights.snapshot import SnapshotStore

    made, sizes, extra = [], [], []
    make_fn, update_fn = orchestrator.make_backend, SnapshotStore.update

    def spy_make(name, spec, **options):
        made.append(make_fn(name, spec, **options))
        return made[-1]

    def spy_update(self, version, b_training):
        update_fn(self, version, b_training)
        sizes.append(len(self.states))
        extra.extend(sorted(set(self.states) - self.wanted(b_training)))

    trainer_rss, engine_rss = [], []

    def on_step(step, metrics, result):
        trainer_rss.append(rss_mb())
        engine_rss.append(rss_mb(made[-1].proc.pid))

    orchestrator.make_backend, SnapshotStore.update = spy_make, spy_update
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            orchestrator.train(load_config(None, [*TINY, f"steps={steps}", f"out={Path(tmp) / 'soak'}"]), on_step=on_step)
    finally:
        orchestrator.make_backend, SnapshotStore.update = make_fn, update_fn
    warm = max(1, steps // 10) - 1
    return {
        "steps": steps,
        "wall_s": time.perf_counter() - t0,
        "trainer_rss_mb": (trainer_rss[warm], trainer_rss[-1]),
        "engine_rss_mb": (engine_rss[warm], engine_rss[-1]),
        "trainer_growth": trainer_rss[-1] / trainer_rss[warm] - 1,
        "engine_growth": engine_rss[-1] / engine_rss[warm] - 1,
        "store_max": max(sizes),
        "store_unneeded": len(extra),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args(argv)
    r = soak(args.steps)
    lines = [
        f"{r['steps']} steps of `satrl train {' '.join(TINY)}`, {r['wall_s']:.0f} s (the machine was shared).",
        "",
        "| process | RSS after warm-up (MB) | RSS at the end (MB) | growth |",
        "|---|---|---|---|",
        f"| trainer | {r['trainer_rss_mb'][0]:.0f} | {r['trainer_rss_mb'][1]:.0f} | {100 * r['trainer_growth']:+.1f} % |",
        f"| engine | {r['engine_rss_mb'][0]:.0f} | {r['engine_rss_mb'][1]:.0f} | {100 * r['engine_growth']:+.1f} % |",
        "",
        f"Snapshot store: at most {r['store_max']} versions held; versions held that no pending batch needed: "
        f"{r['store_unneeded']}.",
    ]
    print("\n".join(lines))
    if args.steps >= 2000:
        write_section("Soak", "python -m benchmarks.soak", "\n".join(lines))
    ok = r["trainer_growth"] < 0.05 and r["engine_growth"] < 0.05 and r["store_unneeded"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
