"""The training loop, top to bottom: generate with a (stale) policy, train, broadcast, evaluate, checkpoint.

Read :func:`train` first; everything else is a helper it calls. The lag schedule says which version
generates each batch; :class:`~satrl.loop.rollouts.Rollouts` submits a batch to the backend as soon as that
version exists, so the engine works while the trainer trains, and a concurrent run equals a sequential one.
The run directory (:class:`~satrl.rundir.files.RunDir`) only reads and writes files; the loop applies what
it reads. Under data parallel every rank runs this loop: ``ranks`` (:mod:`satrl.launch.data_parallel`)
carries what only rank 0 knows to the others, whose run directory, rollouts and evaluator are stand-ins
(:mod:`satrl.launch.stand_ins`); on one process it does nothing.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import torch

from satrl.config.run import RunConfig
from satrl.diagnostics.lag import multi_version
from satrl.dtypes import set_tf32
from satrl.engines.registry import pad_id
from satrl.launch.data_parallel import Ranks, following
from satrl.launch.setup import (
    build_evaluator,
    build_run_dir,
    build_trainer,
    check_context,
    check_snapshots,
    worker_spec,
)
from satrl.launch.stand_ins import ReceivedRollouts
from satrl.loop.rollouts import Rollouts
from satrl.pipeline.buffer import Taken
from satrl.pipeline.engines_host.backends import backend_options, make_backend
from satrl.pipeline.schedules import Schedule, inflight_versions, make_schedule
from satrl.rundir.files import RunDir, RunState
from satrl.tasks import make_task
from satrl.training import checkpoint as ckpt
from satrl.training.dp import DataParallel
from satrl.types import Batch, SkipsRows, TrainerLike


def train(cfg: RunConfig, resume: bool = False, on_step: Callable[[int, dict, dict | None], None] | None = None,
          ctx: DataParallel | None = None) -> dict | None:  # fmt: skip
    """Run (or resume) one training run; returns its summary (also written to ``summary.json``). ``ctx``: under
    data parallel, this process's place in the job: every rank runs this loop, and what only rank 0 does sits
    behind stand-ins elsewhere (:mod:`~satrl.launch.data_parallel`), which return None. The run directory
    is locked against other processes until this returns or raises; a fresh run that fails before its first step
    leaves nothing in it (:meth:`RunDir.abandon`)."""
    ranks = following(ctx)  # the other data-parallel ranks as this one sees them; nobody on one process
    run = build_run_dir(cfg, resume, ranks)
    try:
        return _train(cfg, run, resume, on_step, ranks)
    except BaseException as err:
        ranks.release()  # rank 0 refused the run before its plan: the others exit quietly (else torchrun ends them)
        if isinstance(err, Exception) and not resume and not run.stepped:  # failed at start-up: a retry starts over
            run.abandon()
        raise
    finally:
        run.release()


def _train(cfg: RunConfig, run: RunDir, resume: bool, on_step, ranks: Ranks) -> dict | None:
    torch.set_num_threads(cfg.trainer_threads)  # a grid caps it with train.max_threads (W x threads <= cores)
    set_tf32(cfg.train.tf32)  # process-wide, so here where the program starts
    torch.manual_seed(cfg.seed)
    task = make_task(cfg.task.name, **cfg.task_kwargs)  # here too, so bad data fails before any engine starts
    run.skipped_rows = len(task.skipped) if isinstance(task, SkipsRows) else 0
    trainer, tokenizer = build_trainer(cfg, ranks.ctx)
    ranks.built()  # every rank built its trainer in the same collectives: the others wait for the plan
    n_batches = math.ceil(cfg.steps / cfg.steps_per_batch)
    rollouts = _rollouts(cfg, n_batches, pad_id(tokenizer), ranks, trainer)
    evaluator = build_evaluator(cfg, tokenizer, task, ranks)
    state = (_resume(run, trainer, rollouts, cfg, evaluator.due, ranks) if resume
             else _fresh(run, trainer, rollouts, ranks))  # fmt: skip
    run.record_session(trainer.version, cfg.trainer_threads)  # environment.json: code, machine
    evaluator.prepare()
    first = _first_batch(task, cfg.seed, cfg.train.prompts_per_batch)
    check_context(cfg, trainer.model, tokenizer, [*evaluator.pool, *first])
    if trainer.version == 0 and evaluator.due(0, cfg.steps):  # the base score: the eval collapse rule's reference
        run.log_eval(0, evaluator(trainer))
    with rollouts.running(lambda: make_backend(cfg.backend, worker_spec(cfg), **backend_options(cfg))):
        for b in range(state.next_batch, n_batches):
            rollouts.submit_ready(trainer.version, b)  # rollouts ahead
            got = rollouts.take(b)  # get the batch (the other ranks: the one rank 0 sends next)
            batch = got.batch
            ranks.train(batch, b, rollouts.store.states)  # rank 0: every rank trains it
            t0 = time.perf_counter()
            for metrics, rows in trainer.train_batch(batch, b, rollouts.store.state, stop_at=cfg.steps):  # train it
                v = trainer.version  # every rank gathers its weights if the store or the evaluator reads them:
                ranks.sync(trainer, gather=rollouts.store.wants(v, b) or evaluator.due(v, cfg.steps))
                rollouts.trained(trainer.version, b)  # keep and push the new weights
                metrics.update(_batch_metrics(batch, rows, time.perf_counter() - t0, got, rollouts))
                if cfg.model.chat.template:  # the rendered prompts' mean length (else the log is as it was)
                    metrics["train/prompt_tokens"] = float(batch.prompt_len[rows].float().mean())
                got = Taken(batch, 0.0, 0, 0, 0)  # waits, drops, holds, timeouts: logged on the first step
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
            ranks.sync(trainer, gather=due)  # every rank: the checkpoint's weights
            if due:  # checkpoint (every rank writes its shards)
                run.checkpoint(trainer.version, trainer.export.weights(), _payload(trainer, rollouts, state),
                               write_extra=trainer.export.write_shards)  # fmt: skip
    return run.finish(trainer.version)


def _rollouts(cfg: RunConfig, n_batches: int, pad: int, ranks: Ranks,
              trainer: TrainerLike) -> Rollouts | ReceivedRollouts:  # fmt: skip
    """The rollouts: rank 0's (or the one process's) schedule, snapshot store (of ``trainer``'s versions, as its
    export makes them: ``WeightExport.snapshot``) and engine; on the other data-parallel ranks, the batches rank 0
    sends."""
    if not ranks.rank0:
        return ReceivedRollouts(ranks)
    S, P, K, N = cfg.steps_per_batch, cfg.train.prompts_per_batch, cfg.lag.inflight_every, cfg.engine.max_new_tokens
    sched = make_schedule(cfg.lag.schedule, S, cfg.lag.n, cfg.lag.max_staleness, cfg.seed, cfg.lag.on_stale)
    return Rollouts(sched, lambda b: _versions(sched, b, P, K, N), trainer.export.snapshot, P, n_batches,
                    inflight_every=K, pad_id=pad)  # fmt: skip


def _versions(sched: Schedule, b: int, P: int, every: int = 0, tokens: int = 1) -> set[int]:
    """Every version that samples a token of batch b: each group's start, and under in-flight updates
    (``every`` > 0) the versions its ``tokens`` decode steps move on to (``schedules.inflight_versions``)."""
    if every <= 0:
        return {sched.version(b, g) for g in range(P)}
    cap = sched.first_step(b)
    return set().union(*(inflight_versions(sched.version(b, g), cap, every, tokens) for g in range(P)))


def _fresh(run: RunDir, trainer: TrainerLike, rollouts: Rollouts, ranks: Ranks) -> RunState:
    state = run.fresh()
    ranks.start(resume=False, next_batch=0)
    ranks.sync(trainer, gather=True)  # version 0: batch 0 is generated with it, step 0 may be evaluated
    rollouts.fresh(state)
    return state


def _resume(run: RunDir, trainer: TrainerLike, rollouts: Rollouts, cfg: RunConfig, due: Callable[[int, int], bool],
            ranks: Ranks) -> RunState:  # fmt: skip
    """Apply the run's latest checkpoint (or start over if it has none) once the folder checks out (checkpoint
    files and config, :meth:`RunDir.load` and :meth:`RunDir.check_config`), check that its settings can go on
    to ``steps``, and only then cut the logs and rewrite ``config.yaml``: a refused resume changes no file."""
    loaded, steps = run.load(), cfg.steps
    if loaded is None:  # killed before its first checkpoint: starts over, as config.yaml says (plus what may change)
        run.check_unstarted()
        run.save_config()
        return _fresh(run, trainer, rollouts, ranks)
    planned = run.check_config(loaded)
    check_snapshots(loaded.snapshots, cfg.diagnostics.decompose)
    ranks.start(resume=True, next_batch=loaded.run.next_batch)  # data parallel: every rank loads its shards now
    with ckpt.applying(loaded.path):  # a state of the wrong structure is one line naming the checkpoint
        trainer.export.load(loaded.weights)
        trainer.load_state_dict(loaded.trainer)
        trainer.export.read_shards(loaded.path)  # data parallel: model and optimizer shards (DCP); nothing on one device
        torch.set_rng_state(loaded.rng)
        ranks.sync(trainer, gather=True)  # the version resumed: the store may keep it, step 0 be evaluated
        rollouts.restore(loaded, trainer.version)
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
