"""One training step of a real config, in process, split by phase: wall seconds, CPU seconds and peak resident
memory of each (docs/real-models.md, "Where a training step's time goes").

    python -m benchmarks.real_step configs/real/smollm2_arith.yaml [key=value ...] [--steps 2] [--threads N] [--trim] [--json OUT]

The trainer is the run's own (``build_trainer``), the batch the run's shape: ``prompts_per_batch`` of the task's
training prompts through the run's chat format, ``group_size`` samples each, responses of ``max_new_tokens`` - 1
random token ids (what a 16-token run mostly samples, 15.0 tokens mean), sampled one version back (``lag.n: 1``),
so the step reads as the run's does: the batch's advantages (OPOB's score norms, or GRPO's group mean), pi_old
where the objective needs it, the per-version forward of ``diagnostics.decompose`` under the previous version's
snapshot, the optimizer step, then the weights' copy and bucket stream the loop pushes to the engine. The first
step warms up (allocator, kernels); the table is the last step's.

Peak memory per phase is the process's VmHWM after resetting it (``/proc/self/clear_refs``, Linux): the phase's
own high-water mark of resident memory, weights and optimizer state included. No engine, no evaluation: their
processes are apart from the trainer's.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


class Phases:
    """Wall and CPU seconds and the resident peak (MB) of each named phase, in order."""

    def __init__(self, trim: bool = False) -> None:
        self.rows: list[dict] = []
        self.trim = trim

    def run(self, name: str, fn):
        _reset_peak()
        cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = fn()
        if self.trim:  # hand the allocator's free pages back (what the trainer does after each step, on Linux)
            release_free_memory()
        cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        self.rows.append({"phase": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                          "peak_mb": round(_kib("VmHWM") / 1024), "after_mb": round(_kib("VmRSS") / 1024)})  # fmt: skip
        return out


def release_free_memory() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def make_batch(cfg, tokenizer, version: int):
    """The run's batch shape: real prompts (chat format), random responses, one version back."""
    from satrl.models.chat import encode_prompt
    from satrl.pipeline.buffer import collate
    from satrl.tasks import make_task
    from satrl.types import Sample

    task = make_task(cfg.task.name, **cfg.task_kwargs)
    fmt, g = cfg.model.chat_format(), torch.Generator().manual_seed(0)
    problems = iter(task.problems("train", cfg.seed))
    samples, T = [], cfg.engine.max_new_tokens - 1
    for p in range(cfg.train.prompts_per_batch):
        ids = encode_prompt(tokenizer, next(problems).prompt, fmt)
        for k in range(cfg.train.group_size):
            resp = torch.randint(0, len(tokenizer), (T,), generator=g).tolist()
            samples.append(Sample(f"s{p}.{k}", f"g{p}", ids, resp, -torch.rand(T, generator=g) * 3, version,
                                  float(torch.rand((), generator=g) < 0.3)))  # fmt: skip
    return collate(samples, tokenizer.pad_token_id)


def one_step(trainer, batch, phases: Phases, snapshot) -> None:
    from satrl.training.batch_loop import version_logp

    s = trainer.settings
    adv, _ = phases.run("advantages", lambda: trainer.advantages(batch))
    old = phases.run("old_logp", lambda: trainer.logp_with(None, batch)) if trainer.needs_old_logp else None
    vlogp = phases.run("version_logp", lambda: version_logp(trainer, batch, lambda v: snapshot)) if s.decompose else None
    phases.run("step", lambda: trainer.step(batch, adv, old, vlogp))
    phases.run("weights_copy", trainer.export.weights)
    phases.run("buckets", lambda: sum(1 for _ in trainer.export.buckets(torch.bfloat16, 256 << 20)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=2, help="steps measured; the table is the last one's")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: train.threads)")
    ap.add_argument("--trim", action="store_true", help="malloc_trim after every phase")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_intermixed_args(argv)  # key=value overrides before or after the options
    from satrl.config import load_config
    from satrl.launch.setup import build_trainer

    cfg = load_config(args.config, args.overrides)
    torch.set_num_threads(args.threads or cfg.trainer_threads)
    setup = Phases()
    trainer, tokenizer = setup.run("build_trainer", lambda: build_trainer(cfg))
    # the previous version's fp32 copy, which only the d = dpi + dimpl split reads (else the store keeps buckets)
    snapshot = setup.run("snapshot", lambda: dict(trainer.export.weights())) if cfg.diagnostics.decompose else None
    trainer.version = 1  # the batch below is one version back, as at lag.n 1
    result = {"config": args.config, "overrides": args.overrides, "threads": torch.get_num_threads(),
              "setup": setup.rows, "steps": []}  # fmt: skip
    for _ in range(args.steps):
        batch = make_batch(cfg, tokenizer, trainer.version - 1)
        phases = Phases(args.trim)
        t0 = time.perf_counter()
        one_step(trainer, batch, phases, snapshot)
        result["steps"].append({"rows": phases.rows, "wall_s": round(time.perf_counter() - t0, 2),
                                "shape": list(batch.input_ids.shape)})  # fmt: skip
        snapshot = dict(trainer.export.weights()) if cfg.diagnostics.decompose else None
    result["maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    for row in setup.rows + result["steps"][-1]["rows"]:
        print(f"{row['phase']:>14} {row['wall_s']:8.2f} s wall {row['cpu_s']:8.2f} s cpu  peak {row['peak_mb']:6d} MB"
              f"  after {row['after_mb']:6d} MB")  # fmt: skip
    print(f"last step {result['steps'][-1]['wall_s']} s, batch {result['steps'][-1]['shape']}, "
          f"process peak {result['maxrss_mb']} MB")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
