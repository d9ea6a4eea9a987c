"""How much quieter is an evaluation on more test problems, and what does it cost (issues 58 and 59)? One policy is
scored as a run's evaluator scores it (avg@k at the run's sampling settings, plus greedy), on the first ``--problems``
test problems of the run's eval draw, once per sampling seed; from the per-problem scores:

- ``sd_sampling(n)``: the SD of avg@k over n problems that comes from the k samples alone (the part that differs
  between two runs evaluated on the same problems, and the part a larger evaluation removes):
  sqrt(mean_i p_i (1 - p_i) / (k n)), p_i the problem's success rate (its avg@k pooled over the seeds), and, as a
  check, the SD across seeds of the same n problems' avg@k (``sd_sampling_seen``);
- ``sd_problems(n)``: the SD of avg@k over a draw of n problems, sqrt(var_i p_i / n) (the problem draw's part; shared
  by every run of a trial evaluated on the same draw);
- seconds per evaluation of n problems (k samples and one greedy completion each), from the measured time per problem.

    python -m benchmarks.eval_noise configs/grpo.yaml model.name=tiny-arith-moe eval.problem_seed=3000 --problems 400
    python -m benchmarks.eval_noise configs/grpo.yaml ... --run RUN_DIR   # that run's last checkpoint, scored on the
                                                                         # config's problems and settings

Prints a markdown table and a JSON line (``--json PATH`` writes the JSON, per-problem scores included).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path


def score(config: str, overrides: list[str], problems: int, seeds: int, run: str | None = None) -> dict:
    """Per-problem avg@k, greedy and seconds, per sampling seed, of the config's policy, or of the last checkpoint of
    the run ``run`` (its base policy must be the config's)."""
    import torch

    from satrl.apps.runs import checkpoint_of, checkpoint_step, checkpoint_weights
    from satrl.config import load_config
    from satrl.engines.registry import engine_for
    from satrl.launch.setup import sampling_params
    from satrl.models import load_tokenizer
    from satrl.tasks import make_task
    from satrl.tasks.evaluate import evaluate, split_val_test

    cfg = load_config(config, overrides)
    torch.set_num_threads(cfg.trainer_threads)
    task = make_task(cfg.task.name, **cfg.task_kwargs)
    pool, _, test = split_val_test(task.problems("eval", 0), 1, problems)
    chosen = [pool[i] for i in test]
    tokenizer = load_tokenizer(cfg.model.source)
    engine = engine_for(cfg.engine.name, tokenizer, model_path=cfg.model.source, numerics=cfg.engine.numerics,
                        **dict(cfg.engine.kwargs))  # fmt: skip
    if run is not None:
        ckpt = checkpoint_of(run, None)
        engine.load_weights(checkpoint_weights(ckpt), checkpoint_step(ckpt))
    out = {"task": cfg.task.name, "model": cfg.model.source, "k": cfg.eval.k, "problems": len(chosen),
           "run": run, "seeds": []}  # fmt: skip
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = evaluate(engine, tokenizer, task, k=cfg.eval.k, sampling=sampling_params(cfg), seed=1000 + seed,
                       problems=chosen)  # fmt: skip
        out["seeds"].append({"seed": 1000 + seed, "seconds": time.perf_counter() - t0,
                             "per_problem": res.per_problem, "greedy": res.greedy})  # fmt: skip
        print(f"seed {1000 + seed}: avg@{cfg.eval.k} {res.avg_at_k:.4f} in {out['seeds'][-1]['seconds']:.0f} s",
              flush=True)  # fmt: skip
    return out


def curve(record: dict, sizes: list[int]) -> list[dict]:
    """The noise and cost of an evaluation of each size (see the module docstring), in points (x 100) and seconds."""
    k, runs = record["k"], record["seeds"]
    n_all = record["problems"]
    p = [statistics.fmean(r["per_problem"][i] for r in runs) for i in range(n_all)]
    within = statistics.fmean(q * (1 - q) for q in p)
    between = statistics.pvariance(p)
    per_problem_s = statistics.median(r["seconds"] for r in runs) / n_all
    rows = []
    for n in sizes:
        seen = None
        if len(runs) >= 2 and n <= n_all:  # the same n problems, scored with two seeds: SD of one = |a - b| / sqrt 2
            blocks = [range(b * n, (b + 1) * n) for b in range(n_all // n)]
            diffs = [(statistics.fmean(runs[0]["per_problem"][i] for i in blk)
                      - statistics.fmean(runs[1]["per_problem"][i] for i in blk)) for blk in blocks]  # fmt: skip
            seen = 100 * math.sqrt(statistics.fmean(d * d for d in diffs) / 2)
        rows.append({"n": n, "sd_sampling": 100 * math.sqrt(within / (k * n)), "sd_sampling_seen": seen,
                     "sd_problems": 100 * math.sqrt(between / n), "seconds": per_problem_s * n})  # fmt: skip
    return rows


def table(record: dict, rows: list[dict]) -> str:
    mean = 100 * statistics.fmean(statistics.fmean(r["per_problem"]) for r in record["seeds"])
    head = (f"{record['task']}, {record['model']}{' (run ' + record['run'] + ')' if record['run'] else ''}: "
            f"avg@{record['k']} {mean:.1f} % on {record['problems']} test problems, {len(record['seeds'])} sampling "
            "seeds\n\n| test problems | SD from sampling (pts) | seen across seeds | SD from the draw (pts) | "
            "seconds per evaluation |\n| ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    seen = ["" if r["sd_sampling_seen"] is None else f"{r['sd_sampling_seen']:.2f}" for r in rows]
    body = [f"| {r['n']} | {r['sd_sampling']:.2f} | {s} | {r['sd_problems']:.2f} | {r['seconds']:.0f} |"
            for r, s in zip(rows, seen)]  # fmt: skip
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a run config (YAML): the policy, task, problems and sampling settings")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    ap.add_argument("--problems", type=int, default=400, help="test problems scored (default 400)")
    ap.add_argument("--seeds", type=int, default=2, help="sampling seeds (default 2)")
    ap.add_argument("--sizes", default="100,200,400", help="evaluation sizes of the curve (default 100,200,400)")
    ap.add_argument("--run", help="score this run directory's last checkpoint instead of the base policy")
    ap.add_argument("--json", type=Path, help="write the record (per-problem scores included) and the curve here")
    a = ap.parse_args(argv)
    record = score(a.config, a.overrides, a.problems, a.seeds, a.run)
    rows = curve(record, [int(s) for s in a.sizes.split(",")])
    print(table(record, rows))
    if a.json:
        a.json.write_text(json.dumps({**record, "curve": rows}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
