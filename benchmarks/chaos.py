"""Chaos run: SIGKILL a short run at seeded random points, feed hostile data and configs, kill the engine.

    python -m benchmarks.chaos                  # 12 kill points, every hostile input, engine kills
    python -m benchmarks.chaos --points 20 --seed 3
    python -m benchmarks.chaos --cases hang,checkpoint   # only some cases (kill, hostile, engine, hang, checkpoint,
                                                         # folders, dp)
    python -m benchmarks.chaos --write-doc      # also writes the "Chaos" section of docs/benchmarks.md

Kill anywhere: one short run (sequential backend, a checkpoint per batch) is relaunched with
``satrl train --resume`` after each SIGKILL until it finishes; each kill is either a named fault point
(``SATRL_FAULT``, :mod:`satrl.faults`: inside checkpoint writes, evaluation, weight loading into the engine,
half-way through a metrics line, a rollout) reached the 1st or 2nd time in that process, or (every 4th) a
kill from outside at a random time. When the run finishes, every metrics and eval line (timings aside) must equal an
uninterrupted run's; a kill counts as "resumed identical" when the run it hit ends identical. Hostile
inputs: every dataset of :data:`BAD_DATASETS` and config of :data:`BAD_CONFIGS` must give a clean outcome
(tests/faults/test_hostile.py states which). Engine kills: the local backend's engine process is SIGKILLed
three times during a run; the samples trained must be exactly the uninterrupted run's. Hangs: the same with
SIGSTOP and a 3 s ``engine.timeout_s`` (each hung engine killed and replaced). Damaged checkpoints: every case
of ``benchmarks.hostile.BAD_CHECKPOINTS`` under ``satrl train --resume`` must exit 2 with one line. Run folders
(:mod:`benchmarks.folder_faults`, runnable alone): damaged metrics logs, a locked folder, ``out=`` an
ordinary folder, an extended run, an edited grid, an emptied or edited config.yaml, a resume changing the seed,
checkpoint weights deleted or zeroed, an edited grid base file. Data parallel (:mod:`benchmarks.dp_faults`,
runnable alone, needs torchrun): engine deaths and hangs under ``weights.transport=dist`` and a stopped rank,
each ending identical to the unbroken data-parallel run. The summary line is what the README quotes.
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

from benchmarks._tiny import TINY, env, read_stable
from benchmarks.dp_faults import dp_faults
from benchmarks.folder_faults import folder_faults

RUN = ["steps=8", "eval.every=2", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=7"]
POINTS = ("checkpoint.weights", "checkpoint.state", "metrics.write", "eval.start", "engine.load_weights",
          "worker.rollout")  # fmt: skip


def train_args(out: Path) -> list[str]:
    """The arguments of ``satrl`` that start the run into ``out``, or resume it once it has a config.yaml."""
    run = ["--resume", str(out)] if (out / "config.yaml").is_file() else [*TINY, *RUN, f"out={out}"]
    return ["train", *run, "--no-progress"]


def _launch(out: Path, fault: str | None) -> subprocess.Popen:
    extra = {"SATRL_FAULT": fault} if fault else {}
    return subprocess.Popen([sys.executable, "-m", "satrl", *train_args(out)], env=env(**extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def kill_anywhere(work: Path, points: int = 10, seed: int = 0, log=print, launch=_launch) -> dict:
    """SIGKILL runs at ``points`` seeded random points; returns counts (see the module docstring). ``launch(out,
    fault)``: starts one ``satrl`` process of the chain (a :class:`subprocess.Popen`, or what quacks like one)."""
    rng = random.Random(seed)
    ref, start = work / "reference", time.monotonic()
    proc = launch(ref, None)  # launched as the chain's runs are, so that its time is theirs
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"the uninterrupted reference run failed: {proc.stderr.read().decode(errors='replace')[-1500:]}")
    # An outside kill lands within a run's time: at first the reference's (which may include a server's start-up),
    # then that of the last run that ended by itself (a resumed run is shorter than a whole one)
    span = time.monotonic() - start
    want = read_stable(ref / "metrics.jsonl"), read_stable(ref / "eval.jsonl")
    tried = identical = chains = 0
    kills_in_chain: list[str] = []
    out = work / f"chain{chains}"
    for _ in range(4 * points):
        if tried >= points and not kills_in_chain:
            break
        timed = tried % 4 == 3  # every 4th kill comes from outside, at a random time
        fault = None if timed or tried >= points else f"{rng.choice(POINTS)}:{rng.randint(1, 2)}"
        proc, started = launch(out, fault), time.monotonic()
        if timed and tried < points:
            delay = rng.uniform(0.1, 0.9) * span
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
        span = time.monotonic() - started
        same = (read_stable(out / "metrics.jsonl"), read_stable(out / "eval.jsonl")) == want
        identical += len(kills_in_chain) if same else 0
        log(f"chain {chains}: kills {kills_in_chain} -> {'identical' if same else 'DIFFERENT'}")
        chains, kills_in_chain = chains + 1, []
        out = work / f"chain{chains}"
    return {"tried": tried, "identical": identical}


def engine_kills(work: Path, kills: tuple[int, ...] = (1, 4, 7), sig: int = signal.SIGKILL, extra: tuple[str, ...] = ()) -> dict:
    """Send ``sig`` (SIGKILL; SIGSTOP: a hang) to the local backend's engine process at the first step from each
    of ``kills`` on where it is one not signalled before (a replaced engine shows up only when the trainer next
    waits for a batch); lost/duplicated samples against a sequential run. ``extra``: more overrides."""
    from satrl.config import load_config
    from satrl.loop import orchestrator
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

    signalled: list[int] = []

    def on_step(step, metrics, result):
        pid = made[-1].proc.pid
        if len(signalled) < len(kills) and step >= kills[len(signalled)] and pid not in signalled:
            signalled.append(pid)
            os.kill(pid, sig)

    args = [*TINY, "steps=10", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=3", *extra]
    trainer_mod.Trainer.step, orchestrator.make_backend = spy_step, spy_make
    try:
        orchestrator.train(load_config(None, [*args, f"out={work / 'engine-ref'}"]))
        ref, seen[:] = list(seen), []
        cfg = load_config(None, [*args, "backend=local", f"out={work / 'engine-killed'}"])
        orchestrator.train(cfg, on_step=on_step)
    finally:
        trainer_mod.Trainer.step, orchestrator.make_backend = step_fn, make_fn
    restarts = made[-1].restarts
    return {"lost": len(set(ref) - set(seen)), "duplicated": len(seen) - len(set(seen)), "restarts": restarts,
            "identical": seen == ref}  # fmt: skip


def engine_hangs(work: Path, stops: tuple[int, ...] = (1, 4)) -> dict:
    """SIGSTOP the engine process (a hang) after the given steps, with a 3 s ``engine.timeout_s``: each hung
    engine must be killed and replaced, its batches re-issued; lost/duplicated samples as :func:`engine_kills`."""
    return engine_kills(work, stops, signal.SIGSTOP, ("steps=12", "engine.timeout_s=3"))


def bad_checkpoints(work: Path) -> dict:
    """Every damaged checkpoint of :data:`benchmarks.hostile.BAD_CHECKPOINTS` under ``satrl train --resume``:
    (tried, clean) where clean is exit 2 with one line naming the checkpoint."""
    from benchmarks.hostile import BAD_CHECKPOINTS, check_checkpoint
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    finished = work / "finished"
    train(load_config(None, [*TINY, "steps=2", f"out={finished}"]))
    problems = [check_checkpoint(finished, work, name) for name in BAD_CHECKPOINTS]
    for p in problems:
        if p is not None:
            print(f"not clean: {p}", file=sys.stderr)
    return {"tried": len(problems), "clean": problems.count(None)}


def hostile_inputs(work: Path) -> dict:
    """Every hostile dataset and config: (tried, clean) where clean is the outcome the tests require."""
    from benchmarks.hostile import BAD_CONFIGS, BAD_DATASETS, check_config, check_dataset

    problems = [check_dataset(work / "data", name) for name in BAD_DATASETS]
    problems += [check_config(work / f"cfg{i}", *c) for i, c in enumerate(BAD_CONFIGS)]
    for p in problems:
        if p is not None:
            print(f"not clean: {p}", file=sys.stderr)
    return {"tried": len(problems), "clean": problems.count(None)}


# Each case: what it prints in the summary line, and whether its result is clean.
PARTS = {
    "kill": (lambda r: f"kill points {r['tried']} tried / {r['identical']} resumed identical",
             lambda r: r["identical"] == r["tried"]),
    "hostile": (lambda r: f"bad inputs {r['tried']} tried / {r['clean']} clean exits", lambda r: r["clean"] == r["tried"]),
    "engine": (lambda r: f"samples lost {r['lost']}, duplicated {r['duplicated']} ({r['restarts']} engine restarts)",
               lambda r: r["identical"]),
    "hang": (lambda r: f"hung engines: samples lost {r['lost']}, duplicated {r['duplicated']} ({r['restarts']} restarts)",
             lambda r: r["identical"] and r["restarts"] >= 1),
    "checkpoint": (lambda r: f"damaged checkpoints {r['tried']} tried / {r['clean']} clean exits",
                   lambda r: r["clean"] == r["tried"]),
    "folders": (lambda r: f"run-folder faults {r['tried']} tried / {r['clean']} clean", lambda r: r["clean"] == r["tried"]),
    "dp": (lambda r: f"data-parallel faults {r['tried']} tried / {r['identical']} identical",
           lambda r: r["tried"] > 0 and r["identical"] == r["tried"]),
}  # fmt: skip


def summary_line(kill: dict | None = None, hostile: dict | None = None, engine: dict | None = None, **more: dict) -> str:
    """The line the README quotes: one part per case run, in :data:`PARTS` order."""
    results = {"kill": kill, "hostile": hostile, "engine": engine, **more}
    return "chaos: " + "; ".join(PARTS[k][0](r) for k, r in results.items() if r is not None)


def _folder_faults(work: Path) -> dict:
    return folder_faults(work)


def _dp_faults(work: Path) -> dict:
    return dp_faults(work)


def run_cases(work: Path, cases: list[str], points: int = 12, seed: int = 0) -> dict[str, dict]:
    runners = {
        "kill": lambda: kill_anywhere(work / "kill", points, seed),
        "hostile": lambda: hostile_inputs(work / "hostile"),
        "engine": lambda: engine_kills(work / "engine"),
        "hang": lambda: engine_hangs(work / "hang"),
        "checkpoint": lambda: bad_checkpoints(work / "checkpoint"),
        "folders": lambda: _folder_faults(work / "folders"),
        "dp": lambda: _dp_faults(work / "dp"),
    }
    return {name: runners[name]() for name in PARTS if name in cases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=12, help="kill points to try")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill points (replay a failure with it)")
    p.add_argument("--cases", default=",".join(PARTS), help=f"comma-separated cases to run (default: all of {','.join(PARTS)})")
    p.add_argument("--write-doc", action="store_true", help="write the result to docs/benchmarks.md")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(PARTS))
    if unknown:
        p.error(f"unknown case(s) {unknown}; valid choices: {', '.join(PARTS)}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_cases(Path(tmp), cases, args.points, args.seed)
    line = summary_line(**results)
    record = {"seed": args.seed, **results, "wall_s": round(time.perf_counter() - t0, 1)}
    print(line)
    print(json.dumps(record))
    if args.write_doc:
        from benchmarks._report import write_section

        write_section("Chaos", f"python -m benchmarks.chaos --points {args.points} --seed {args.seed} --write-doc",
                      f"{line}\n\n```json\n{json.dumps(record)}\n```\n")  # fmt: skip
    return 0 if all(PARTS[k][1](r) for k, r in results.items()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
