"""The training loop, top to bottom: generate with a (stale) policy, train, broadcast, evaluate, checkpoint.

Read :func:`train` first; everything else is a helper it calls. The lag schedule says which version
generates each batch; :class:`~satrl.pipeline.rollouts.Rollouts` submits a batch to the backend as soon as that
version exists, so the engine works while the trainer trains, and a concurrent run equals a sequential one.
The run directory (:class:`~satrl.pipeline.rundir.RunDir`) only reads and writes files; the loop applies what
it reads. Under data parallel this is rank 0's loop: ``followers`` (:mod:`satrl.pipeline.launch.data_parallel`)
tells the other ranks, which train each batch with it, what only this loop knows; on one process it does nothing.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import torch

from satrl.diagnostics.lag import multi_version
from satrl.dtypes import set_tf32
from satrl.engines.registry import pad_id
from satrl.pipeline.buffer import collate
from satrl.pipeline.engine_side.backends import backend_options, make_backend
from satrl.pipeline.launch.data_parallel import Followers, following
from satrl.pipeline.launch.setup import (
    build_evaluator,
    build_run_dir,
    build_trainer,
    check_context,
    check_snapshots,
    snapshot_weights,
    worker_spec,
)
from satrl.pipeline.rollouts import Rollouts, Taken
from satrl.pipeline.run_config import RunConfig
from satrl.pipeline.rundir import RunDir, RunState
from satrl.pipeline.schedules import Schedule, inflight_versions, make_schedule
from satrl.provenance import record_session
from satrl.tasks import make_task
from satrl.training import checkpoint as ckpt
from satrl.training.dp import DataParallel
from satrl.types import Batch, SkipsRows, TrainerLike
from satrl.weights.snapshot import Snapshot


def train(cfg: RunConfig, resume: bool = False, on_step: Callable[[int, dict, dict | None], None] | None = None,
          ctx: DataParallel | None = None) -> dict:  # fmt: skip
    """Run (or resume) one training run; returns its summary (also written to ``summary.json``). ``ctx``: under
    data parallel, this process's place in the job (rank 0's: the others follow, :mod:`~satrl.pipeline.launch.data_parallel`).
    The run directory is locked against other processes until this returns or raises; a fresh run that fails before
    its first step leaves nothing in it (:meth:`RunDir.abandon`)."""
    run = build_run_dir(cfg, resume=resume, data_parallel=ctx is not None)
    followers = following(ctx)  # data parallel: the other ranks, which mirror this loop's collectives; none on one process
    try:
        summary = _train(cfg, run, resume, on_step, followers)
    except BaseException as err:
        followers.release()  # refused before its plan: the others exit quietly (else torchrun ends them)
        if isinstance(err, Exception) and not resume and not run.stepped:  # failed at start-up: a retry starts over
            run.abandon()
        raise
    finally:
        run.release()
    followers.end()  # the others stop waiting for the next batch
    return summary


def _train(cfg: RunConfig, run: RunDir, resume: bool, on_step, followers: Followers) -> dict:
    torch.set_num_threads(cfg.trainer_threads)  # a grid caps it with train.max_threads (W x threads <= cores)
    set_tf32(cfg.train.tf32)  # process-wide, so here where the program starts (each data-parallel rank: follow)
    torch.manual_seed(cfg.seed)
    task = make_task(cfg.task.name, **cfg.task_kwargs)  # here too, so bad data fails before any engine starts
    run.skipped_rows = len(task.skipped) if isinstance(task, SkipsRows) else 0
    trainer, tokenizer = build_trainer(cfg, followers.ctx)
    followers.built()  # every rank built its trainer in the same collectives: the others wait for the plan
    S, P = cfg.steps_per_batch, cfg.train.prompts_per_batch
    n_batches = math.ceil(cfg.steps / S)
    sched = make_schedule(cfg.lag.schedule, S, cfg.lag.n, cfg.lag.max_staleness, cfg.seed, cfg.lag.on_stale)
    K, N = cfg.lag.inflight_every, cfg.engine.max_new_tokens
    rollouts = Rollouts(sched, lambda b: _versions(sched, b, P, K, N), P, n_batches, inflight_every=K)
    snapshot = snapshot_weights(cfg, trainer)  # a version's weights as the store holds them (fp32, or the engine's dtype)
    evaluator = build_evaluator(cfg, tokenizer, task)
    state = (_resume(run, trainer, rollouts, cfg, snapshot, evaluator.due, followers) if resume
             else _fresh(run, trainer, rollouts, snapshot, followers))  # fmt: skip
    record_session(run.path, trainer.version, cfg.trainer_threads, run.changes)  # environment.json: code, machine
    evaluator.prepare()
    check_context(cfg, trainer.model, tokenizer, [*evaluator.pool, *_first_batch(task, cfg.seed, P)])
    if trainer.version == 0 and evaluator.due(0, cfg.steps):  # the base score: the eval collapse rule's reference
        run.log_eval(0, evaluator(trainer))
    with rollouts.running(make_backend(cfg.backend, worker_spec(cfg), **backend_options(cfg))):
        for b in range(state.next_batch, n_batches):
            rollouts.submit_ready(trainer.version, b)  # rollouts ahead
            got = rollouts.take(b)  # get the batch
            batch = collate(got.samples, pad_id(tokenizer))
            followers.train(batch, b, rollouts.store.states)  # every rank trains it
            t0 = time.perf_counter()
            for metrics, rows in trainer.train_batch(batch, b, rollouts.store.state, stop_at=cfg.steps):  # train it
                v = trainer.version  # every rank gathers its weights if the store or the evaluator reads them:
                followers.sync(trainer, gather=rollouts.store.wants(v, b) or evaluator.due(v, cfg.steps))
                rollouts.trained(trainer.version, snapshot, b)  # push the new weights
                metrics.update(_batch_metrics(batch, rows, time.perf_counter() - t0, got, rollouts))
                if cfg.model.chat.template:  # the rendered prompts' mean length (else the log is as it was)
                    metrics["train/prompt_tokens"] = float(batch.prompt_len[rows].float().mean())
                got = Taken(got.samples, 0.0, 0, 0, 0)  # waits, drops, holds, timeouts: logged on the first step
                run.log_step(trainer.version, metrics)
                result = evaluator(trainer) if evaluator.due(trainer.version, cfg.steps) else None  # evaluate
                if result is not None:
                    run.log_eval(trainer.version, result)
                if on_step is not None:
                    on_step(trainer.version, metrics, result)
                t0 = time.perf_counter()
            state.next_batch = b + 1
            rollouts.collect()
            due = (b + 1) % cfg.checkpoint.every == 0 or b + 1 == n_batches
            followers.sync(trainer, gather=due, shards=due)  # every rank: the checkpoint's weights and shards
            if due:  # checkpoint
                run.checkpoint(trainer.version, trainer.export.weights(), _payload(trainer, rollouts, state),
                               write_extra=trainer.export.write_shards)  # fmt: skip
    return run.finish(trainer.version)


def _versions(sched: Schedule, b: int, P: int, every: int = 0, tokens: int = 1) -> set[int]:
    """Every version that samples a token of batch b: each group's start, and under in-flight updates
    (``every`` > 0) the versions its ``tokens`` decode steps move on to (``schedules.inflight_versions``)."""
    if every <= 0:
        return {sched.version(b, g) for g in range(P)}
    cap = sched.first_step(b)
    return set().union(*(inflight_versions(sched.version(b, g), cap, every, tokens) for g in range(P)))


def _fresh(run: RunDir, trainer: TrainerLike, rollouts: Rollouts, snapshot: Callable[[], Snapshot],
           followers: Followers) -> RunState:  # fmt: skip
    state = run.fresh()
    followers.start(resume=False)
    followers.sync(trainer, gather=True)  # version 0: batch 0 is generated with it, step 0 may be evaluated
    rollouts.fresh(state, snapshot)
    return state


def _resume(run: RunDir, trainer: TrainerLike, rollouts: Rollouts, cfg: RunConfig, snapshot: Callable[[], Snapshot],
            due: Callable[[int, int], bool], followers: Followers) -> RunState:  # fmt: skip
    """Apply the run's latest checkpoint (or start over if it has none) once the folder checks out (checkpoint
    files and config, :meth:`RunDir.load` and :meth:`RunDir.check_config`), check that its settings can go on
    to ``steps``, and only then cut the logs and rewrite ``config.yaml``: a refused resume changes no file."""
    loaded, steps = run.load(), cfg.steps
    if loaded is None:  # killed before its first checkpoint: starts over, as config.yaml says (plus what may change)
        run.check_unstarted()
        run.save_config()
        return _fresh(run, trainer, rollouts, snapshot, followers)
    planned = run.check_config(loaded)
    check_snapshots(loaded.snapshots, cfg.diagnostics.decompose)
    followers.start(resume=True)  # data parallel: every rank loads the checkpoint's shards with this one
    with ckpt.applying(loaded.path):  # a state of the wrong structure is one line naming the checkpoint
        trainer.export.load(loaded.weights)
        trainer.load_state_dict(loaded.trainer)
        trainer.export.read_shards(loaded.path)  # data parallel: model and optimizer shards (DCP); nothing on one device
        torch.set_rng_state(loaded.rng)
        followers.sync(trainer, gather=True)  # the version resumed: the store may keep it, step 0 be evaluated
        rollouts.restore(loaded, trainer.version, snapshot)
    rollouts.check_continuable(trainer.version, steps, planned)
    run.resume_at(trainer.version, rollouts.state, loaded.wall_s, lambda step: due(step, steps))
    run.save_config()
    return rollouts.state


def _payload(trainer: TrainerLike, rollouts: Rollouts, state: RunState) -> dict:
    """What a checkpoint holds besides the policy weights (the run directory adds the wall clock)."""
    return {"trainer": trainer.state_dict(), "snapshots": rollouts.store.saved(), "rng": torch.get_rng_state(), "run": state}


def _batch_metrics(batch: Batch, rows: torch.Tensor, step_s: float, got: Taken, rollouts: Rollouts) -> dict:
    """Reward and throughput numbers for one optimizer step."""
    mask = batch.mask[rows]
    return {
        "train/reward": float(batch.rewards[rows].mean()),
        "train/acc": float((batch.rewards[rows] > 0.5).float().mean()),
        "train/response_len": float(mask.sum(1).float().mean()),
        "train/tokens": float(mask.sum()),
        "lag/multi_version_frac": float(multi_version(batch.versions[rows], mask).float().mean()),
        "async/dropped": float(got.dropped),
        "async/held": float(got.held),
        "perf/trainer_tok_s": float(mask.sum()) / max(step_s, 1e-9),
        "perf/trainer_wait_s": got.waited_s,
        **rollouts.engine_metrics(),
        "reward/timeouts": float(got.timeouts),  # graders that hit their time limit (reward 0)
    }


def _first_batch(task, seed: int, P: int) -> list:
    """The first batch's problems, or none if the task cannot serve them (the engine process then says why)."""
    try:
        return list(itertools.islice(task.problems("train", seed), P))
    except ValueError:
        return []
