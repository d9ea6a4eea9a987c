"""Chaos run: SIGKILL a short run at seeded random points, feed hostile data and configs, kill the engine.

    python -m benchmarks.chaos                  # 12 kill points, every hostile input, engine kills
    python -m benchmarks.chaos --points 20 --seed 3
    python -m benchmarks.chaos --write-doc      # also writes the "Chaos" section of docs/benchmarks.md

Kill anywhere: one short run (sequential backend, a checkpoint per batch) is relaunched with
``satrl train --resume`` after each SIGKILL until it finishes; each kill is either a named fault point
(``SATRL_FAULT``, :mod:`satrl.faults`: inside checkpoint writes, evaluation, weight loading into the engine,
half-way through a metrics line, a rollout) reached the 1st or 2nd time in that process, or (every 4th) a
kill from outside at a random time. When the run finishes, every metrics and eval line (timings aside) must equal an
uninterrupted run's; a kill counts as "resumed identical" when the run it hit ends identical. Hostile
inputs: every dataset of :data:`BAD_DATASETS` and config of :data:`BAD_CONFIGS` must give a clean outcome
(tests/faults/test_hostile.py states which). Engine kills: the local backend's engine process is SIGKILLed
three times during a run; the samples trained must be exactly the uninterrupted run's.
The summary line is what the README quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["train.prompts_per_batch=4", "train.group_size=4", "train.minibatches=2", "train.threads=1",
        "engine.max_new_tokens=5", "eval.n_problems=4", "eval.k=2", "checkpoint.every=1",
        "backend=sequential"]  # fmt: skip
RUN = ["steps=8", "eval.every=2", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=7"]
POINTS = ("checkpoint.weights", "checkpoint.state", "metrics.write", "eval.start", "engine.load_weights",
          "worker.rollout")  # fmt: skip
VOLATILE = ("wall_s", "perf/")


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def read_stable(path: Path) -> list[dict]:
    from satrl.jsonl import read_jsonl

    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_jsonl(path)]


def _reference(work: Path) -> Path:
    from satrl.config import load_config
    from satrl.pipeline.orchestrator import train

    out = work / "reference"
    train(load_config(None, [*TINY, *RUN, f"out={out}"]))
    return out


def _launch(out: Path, fault: str | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "satrl", "train"]
    cmd += ["--resume", str(out)] if (out / "config.yaml").is_file() else [*TINY, *RUN, f"out={out}"]
    extra = {"SATRL_FAULT": fault} if fault else {}
    return subprocess.Popen([*cmd, "--no-progress"], env=env(**extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_anywhere(work: Path, points: int = 10, seed: int = 0, log=print) -> dict:
    """SIGKILL runs at ``points`` seeded random points; returns counts (see the module docstring)."""
    rng = random.Random(seed)
    ref = _reference(work)
    want = read_stable(ref / "metrics.jsonl"), read_stable(ref / "eval.jsonl")
    tried = identical = chains = 0
    kills_in_chain: list[str] = []
    out = work / f"chain{chains}"
    for _ in range(4 * points):
        if tried >= points and not kills_in_chain:
            break
        timed = tried % 4 == 3  # every 4th kill comes from outside, at a random time
        fault = None if timed or tried >= points else f"{rng.choice(POINTS)}:{rng.randint(1, 2)}"
        proc = _launch(out, fault)
        if timed and tried < points:
            delay = rng.uniform(1.0, 7.0)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
            fault = f"timer:{delay:.2f}s"
        rc = proc.wait(timeout=600)
        err = proc.stderr.read().decode(errors="replace")
        if rc == -signal.SIGKILL:
            tried += 1
            kills_in_chain.append(fault or "?")
            continue
        if rc != 0:
            raise RuntimeError(f"seed={seed} after kills {kills_in_chain}: exit {rc}: {err[-1500:]}")
        same = (read_stable(out / "metrics.jsonl"), read_stable(out / "eval.jsonl")) == want
        identical += len(kills_in_chain) if same else 0
        log(f"chain {chains}: kills {kills_in_chain} -> {'identical' if same else 'DIFFERENT'}")
        chains, kills_in_chain = chains + 1, []
        out = work / f"chain{chains}"
    return {"tried": tried, "identical": identical}


def engine_kills(work: Path, kills: tuple[int, ...] = (1, 4, 7)) -> dict:
    """SIGKILL the local backend's engine process after the given steps; lost/duplicated samples."""
    from satrl.config import load_config
    from satrl.pipeline import orchestrator
    from satrl.training import trainer as trainer_mod

    seen: list[str] = []
    made: list = []
    step_fn, make_fn = trainer_mod.Trainer.step, orchestrator.make_backend

    def spy_step(self, mb, *a, **k):
        seen.extend(mb.sample_ids)
        return step_fn(self, mb, *a, **k)

    def spy_make(name, spec, **options):
        made.append(make_fn(name, spec, **options))
        return made[-1]

    def on_step(step, metrics, result):
        if step in kills:
            os.kill(made[-1].proc.pid, signal.SIGKILL)

    args = [*TINY, "steps=10", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=3"]
    trainer_mod.Trainer.step, orchestrator.make_backend = spy_step, spy_make
    try:
        orchestrator.train(load_config(None, [*args, f"out={work / 'engine-ref'}"]))
        ref, seen[:] = list(seen), []
        orchestrator.train(load_config(None, [*args, "backend=local", f"out={work / 'engine-killed'}"]), on_step=on_step)
    finally:
        trainer_mod.Trainer.step, orchestrator.make_backend = step_fn, make_fn
    restarts = made[-1].restarts
    return {"lost": len(set(ref) - set(seen)), "duplicated": len(seen) - len(set(seen)), "restarts": restarts,
            "identical": seen == ref}  # fmt: skip


def hostile_inputs(work: Path) -> dict:
    """Every hostile dataset and config: (tried, clean) where clean is the outcome the tests require."""
    from benchmarks.hostile import BAD_CONFIGS, BAD_DATASETS, check_config, check_dataset

    problems = [check_dataset(work / "data", name) for name in BAD_DATASETS]
    problems += [check_config(work / f"cfg{i}", *c) for i, c in enumerate(BAD_CONFIGS)]
    for p in problems:
        if p is not None:
            print(f"not clean: {p}", file=sys.stderr)
    return {"tried": len(problems), "clean": problems.count(None)}


def summary_line(kill: dict, hostile: dict, engine: dict) -> str:
    return (f"chaos: kill points {kill['tried']} tried / {kill['identical']} resumed identical; "
            f"bad inputs {hostile['tried']} tried / {hostile['clean']} clean exits; "
            f"samples lost {engine['lost']}, duplicated {engine['duplicated']} "
            f"({engine['restarts']} engine restarts)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=12, help="kill points to try")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill points (replay a failure with it)")
    p.add_argument("--write-doc", action="store_true", help="write the result to docs/benchmarks.md")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kill = kill_anywhere(work / "kill", args.points, args.seed)
        hostile = hostile_inputs(work / "hostile")
        engine = engine_kills(work / "engine")
    line = summary_line(kill, hostile, engine)
    record = {"seed": args.seed, "kill": kill, "hostile": hostile, "engine": engine, "wall_s": round(time.perf_counter() - t0, 1)}
    print(line)
    print(json.dumps(record))
    if args.write_doc:
        from benchmarks._report import write_section

        write_section("Chaos", f"python -m benchmarks.chaos --points {args.points} --seed {args.seed} --write-doc",
                      f"{line}\n\n```json\n{json.dumps(record)}\n```\n")  # fmt: skip
    ok = kill["identical"] == kill["tried"] and hostile["clean"] == hostile["tried"] and engine["identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
