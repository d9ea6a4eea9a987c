"""The run directory: resolved config, metrics.jsonl, eval.jsonl, checkpoints, summary.json.

Layout and keys: docs/metrics.md. A resumed run truncates its logs to the checkpoint it restarts from, so
the logs of a killed-and-resumed run equal those of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from satrl import faults
from satrl.config import ConfigError, RunConfig, load_config
from satrl.diagnostics import summarize_run
from satrl.diagnostics.collapse import CollapseConfig
from satrl.jsonl import append_jsonl, dumps, read_jsonl, strict, write_jsonl
from satrl.pipeline.buffer import SnapshotStore
from satrl.training import checkpoint as ckpt
from satrl.types import Batch, Sample, SamplingParams


@dataclass
class RunState:
    """Everything the loop needs besides the trainer to continue exactly where it stopped."""

    next_batch: int = 0
    next_submit: int = 0
    ready: dict[int, list[Sample]] = field(default_factory=dict)  # generated, not yet trained
    best: float = -math.inf
    best_step: int | None = None


def _checked(run: object) -> RunState:
    """``run`` if it is a RunState whose counters are counters (a damaged state.json can hold anything)."""
    if not isinstance(run, RunState):
        raise TypeError(f"run state is a {type(run).__name__}, not a RunState")
    for name in ("next_batch", "next_submit"):
        value = getattr(run, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeError(f"run state {name} is {value!r}, not a count")
    if not isinstance(run.ready, dict):
        raise TypeError(f"run state ready is a {type(run.ready).__name__}, not a dict")
    return run


def _append_text(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _tensorboard(path: Path):
    """A TensorBoard writer when the `tensorboard` package is installed, else None (JSONL is the record)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(path))


def _finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class RunDir:
    """One run's directory. Plain arguments (``pipeline.setup.run_dir`` builds them from the config):

    Args:
        path: the directory.
        config: the resolved config as data (every default filled in), saved as ``config.yaml``.
        collapse: the collapse rules of the end-of-run summary.
        warmup_steps: optimizer steps the summary's collapse rule skips (one rollout batch).
        resume: continue the run in ``path`` instead of refusing a directory that holds one.
    """

    def __init__(
        self, path: Path, config: dict, *, collapse: CollapseConfig, warmup_steps: int, resume: bool = False
    ) -> None:
        self.path, self.collapse, self.warmup_steps = Path(path), collapse, warmup_steps
        self.ckpt_dir = self.path / "checkpoints"
        if not resume and (self.path / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.path} already holds a run; resume it with --resume {self.path} or pick out=")
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / "config.yaml.tmp"  # atomic: a killed run never leaves a torn config.yaml
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(self.path / "config.yaml")
        self.t0 = time.perf_counter()
        self.wall_before = 0.0
        self.state = RunState()
        self.skipped_rows = 0  # malformed dataset rows the task skipped (summary.json: data/skipped_rows)
        self.tb = _tensorboard(self.path / "tb")

    @staticmethod
    def config_of(path: str | Path, overrides: list[str] = ()) -> RunConfig:
        """The saved config of a run directory (for ``--resume``), with ``out`` pinned to it."""
        if not (Path(path) / "config.yaml").is_file():
            raise ConfigError(f"--resume {path}: not a run directory (no config.yaml in it)")
        return load_config(Path(path) / "config.yaml", [*overrides, f"out={path}"])

    # -- start -------------------------------------------------------------------------------------
    def fresh(self, trainer, store: SnapshotStore) -> RunState:
        for name in ("metrics.jsonl", "eval.jsonl", "summary.json"):
            (self.path / name).unlink(missing_ok=True)
        store.offer(0, trainer.weights, 0)
        return self.state

    def restore(self, trainer, store: SnapshotStore) -> RunState:
        path = ckpt.latest_checkpoint(self.ckpt_dir)
        if path is None:  # killed before (or while writing) its first checkpoint: the same command starts over
            print(f"satrl: no complete checkpoint in {self.ckpt_dir}; starting from step 0", file=sys.stderr)
            return self.fresh(trainer, store)
        weights, state = ckpt.load_checkpoint(path, {"RunState": RunState, "Sample": Sample})
        with ckpt.applying(path):
            trainer.load_weights(weights)
            trainer.load_state_dict(state["trainer"])
            store.states = dict(state["snapshots"])
            torch.set_rng_state(state["rng"])
            self.state = _checked(state["run"])
            # Batches submitted to the dead backend but not saved as ready must be submitted again.
            self.state.next_submit = self.state.next_batch
            self.wall_before = float(state["wall_s"])
        step = trainer.version  # drop log lines written after the checkpoint: they will be redone
        for name in ("metrics.jsonl", "eval.jsonl"):  # a torn last line (killed mid-append) goes too
            rows = read_jsonl(self.path / name)
            write_jsonl(self.path / name, [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= step])
        return self.state

    # -- during ------------------------------------------------------------------------------------
    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t0

    def log_step(self, step: int, metrics: dict) -> None:
        row = {"step": step, "wall_s": self.wall(), **metrics}
        path = self.path / "metrics.jsonl"
        faults.point("metrics.write", lambda: _append_text(path, dumps(row)[:40]))  # dies leaving half a line
        append_jsonl(path, row)
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)

    def log_eval(self, step: int, result: dict, trainer) -> None:
        append_jsonl(self.path / "eval.jsonl", {"step": step, **result})
        if self.tb is not None:
            for k in ("avg_at_k", "greedy_acc", "val_avg_at_k", "test_avg_at_k"):
                if k in result:
                    self.tb.add_scalar(f"eval/{k}", result[k], step)
        score = result.get("val_avg_at_k", result["avg_at_k"])  # the best checkpoint is chosen on val
        if score > self.state.best:
            self.state.best, self.state.best_step = score, step
            self._best_pending = True

    def checkpoint(self, trainer, store: SnapshotStore, state: RunState) -> None:
        payload = {
            "trainer": trainer.state_dict(),
            "snapshots": store.states,
            "rng": torch.get_rng_state(),
            "run": state,
            "wall_s": self.wall(),
        }
        best = (self.ckpt_dir / "best").read_text().strip() if (self.ckpt_dir / "best").exists() else None
        name = f"step-{trainer.version:06d}"
        if getattr(self, "_best_pending", False):
            best, self._best_pending = name, False
        ckpt.save_checkpoint(self.ckpt_dir, trainer.version, trainer.weights(), payload, keep={best} if best else set())
        if best == name:
            ckpt.mark_best(self.ckpt_dir, name)

    # -- end ---------------------------------------------------------------------------------------
    def finish(self) -> dict:
        if self.tb is not None:
            self.tb.close()
        summary = summarize_run(
            read_jsonl(self.path / "metrics.jsonl", null_as_nan=True),
            read_jsonl(self.path / "eval.jsonl", null_as_nan=True),
            self.collapse,
            warmup_steps=self.warmup_steps,
        )
        summary.update(wall_time_s=self.wall(), status="finished")
        summary["data/skipped_rows"] = self.skipped_rows
        summary = {k: (_finite_or_none(v) if isinstance(v, float) else v) for k, v in summary.items()}
        tmp = self.path / "summary.json.tmp"  # atomic: a kill never leaves a torn summary
        tmp.write_text(json.dumps(strict(summary), indent=2, allow_nan=False) + "\n")
        tmp.replace(self.path / "summary.json")
        return summary


class Evaluator:
    """avg@k and greedy accuracy of the trainer's current weights, with the engine's numerics, on the
    val and test parts of the eval problems (one generation pass over both; scores per part and pooled).
    Plain arguments (``pipeline.setup.evaluator`` builds them from the config):

    Args:
        tokenizer, task: the run's tokenizer and task (its ``eval`` split is scored).
        engine, engine_kwargs, model_path, numerics: how to build the evaluation engine (``engines.engine_for``).
        sampling, k, seed: sampling settings, samples per problem, the run seed (request seeds derive from it).
        every, at_start: evaluate every this many optimizer steps (0: only at the end), and at step 0.
        val_problems, test_problems: problems of each part per evaluation; or ``n_problems``: the first
            n eval problems, split by the same hash (configs from before the split).
    """

    def __init__(
        self,
        tokenizer,
        task,
        *,
        engine: str,
        engine_kwargs: dict,
        model_path: str,
        numerics: str,
        sampling: SamplingParams,
        k: int,
        seed: int,
        every: int,
        at_start: bool,
        val_problems: int,
        test_problems: int,
        n_problems: int | None = None,
    ) -> None:
        self.tokenizer, self.task, self.engine = tokenizer, task, None
        self.engine_name, self.engine_kwargs, self.model_path, self.numerics = engine, engine_kwargs, model_path, numerics
        self.sampling, self.k, self.seed = sampling, k, seed
        self.every, self.at_start = every, at_start
        self.val_problems, self.test_problems, self.n_problems = val_problems, test_problems, n_problems

    def due(self, step: int, last: int) -> bool:
        if step == 0:
            return self.at_start
        return step == last or (self.every > 0 and step % self.every == 0)

    def prepare(self) -> None:
        """Choose the val and test problems (once). Called before training, so that an eval split too small
        for ``eval.*`` fails at once with a one-line TaskError, not at the first evaluation."""
        from satrl.tasks import TaskError
        from satrl.tasks.evaluate import _take, part_of, split_val_test

        if hasattr(self, "pool"):
            return
        try:
            if self.n_problems is not None:  # configs before the split: the same first-n problems as before
                self.pool = _take(self.task, "eval", self.n_problems)
                self.val_idx = [i for i, p in enumerate(self.pool) if part_of(p) == "val"]
                self.test_idx = [i for i, p in enumerate(self.pool) if part_of(p) == "test"]
            else:
                self.pool, self.val_idx, self.test_idx = split_val_test(
                    self.task.problems("eval", 0), self.val_problems, self.test_problems
                )
        except ValueError as err:
            raise TaskError(str(err)) from None

    def __call__(self, trainer) -> dict:
        from satrl.engines.registry import engine_for
        from satrl.tasks.evaluate import evaluate, part_scores

        faults.point("eval.start")
        if self.engine is None:
            self.engine = engine_for(
                self.engine_name,
                self.tokenizer,
                model=trainer.model,
                model_path=self.model_path,
                numerics=self.numerics,
                **self.engine_kwargs,
            )
            self.prepare()
        self.engine.load_weights(trainer.weights(), trainer.version)
        res = evaluate(
            self.engine, self.tokenizer, self.task, k=self.k, sampling=self.sampling, seed=self.seed,
            problems=self.pool,
        )
        out = {"avg_at_k": res.avg_at_k, "greedy_acc": res.greedy_acc, "k": res.k}
        for part, idx in (("val", self.val_idx), ("test", self.test_idx)):
            if idx:
                out.update({f"{part}_{k}": v for k, v in part_scores(res, idx).items()})
                out[f"{part}_n"] = len(idx)
        return out


def batch_metrics(batch: Batch, rows: torch.Tensor, step_s: float, waited_s: float, dropped: int, backend) -> dict:
    """Reward and throughput numbers for one optimizer step."""
    mask = batch.mask[rows]
    return {
        "train/reward": float(batch.rewards[rows].mean()),
        "train/acc": float((batch.rewards[rows] > 0.5).float().mean()),
        "train/response_len": float(mask.sum(1).float().mean()),
        "train/tokens": float(mask.sum()),
        "async/dropped": float(dropped),
        "perf/trainer_tok_s": float(mask.sum()) / max(step_s, 1e-9),
        "perf/trainer_wait_s": waited_s,
        "perf/engine_busy_s": backend.busy_seconds(),
        "perf/engine_restarts": float(getattr(backend, "restarts", 0)),
    }
