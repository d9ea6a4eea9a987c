"""The training loop, top to bottom: generate with a (stale) policy, train, broadcast, evaluate, checkpoint.

Read :func:`train` first; everything else is a helper it calls. The lag schedule says which version
generates each batch; the loop submits a batch to the rollout backend as soon as that version exists, so the
engine works while the trainer trains, and a concurrent run equals a sequential one.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import torch

from satrl.config import RunConfig
from satrl.engines.registry import pad_id
from satrl.pipeline.backends import make_backend
from satrl.pipeline.buffer import SnapshotStore, collate
from satrl.pipeline.rundir import RunDir, RunDirError, batch_metrics
from satrl.pipeline.schedules import Schedule, make_schedule
from satrl.pipeline.setup import (
    backend_options,
    build_evaluator,
    build_run_dir,
    build_trainer,
    check_context,
    worker_spec,
)
from satrl.pipeline.worker import RolloutRequest, WorkerSpec
from satrl.provenance import record_session
from satrl.tasks import make_task


def train(cfg: RunConfig, resume: bool = False, on_step: Callable[[int, dict, dict | None], None] | None = None) -> dict:
    """Run (or resume) one training run; returns its summary (also written to ``summary.json``). The run
    directory is locked against other processes until this returns or raises."""
    run = build_run_dir(cfg, resume=resume)
    try:
        return _train(cfg, run, resume, on_step)
    finally:
        run.release()


def _train(cfg: RunConfig, run: RunDir, resume: bool, on_step) -> dict:
    torch.set_num_threads(cfg.trainer_threads)  # a grid caps it with train.max_threads (W x threads <= cores)
    torch.manual_seed(cfg.seed)
    task = make_task(cfg.task.name, **cfg.task.kwargs)  # here too, so bad data fails before any engine starts
    run.skipped_rows = len(getattr(task, "skipped", ()))
    trainer, tokenizer = build_trainer(cfg)
    spec: WorkerSpec = worker_spec(cfg)
    S, P = cfg.steps_per_batch, cfg.train.prompts_per_batch
    n_batches = math.ceil(cfg.steps / S)
    sched = make_schedule(cfg.lag.schedule, S, cfg.lag.n, cfg.lag.max_staleness, cfg.seed)
    # Batches past the last one count too: the last checkpoint keeps the weights an extension needs
    # (`satrl train --resume DIR steps=<more>`); the runs themselves are unchanged.
    store = SnapshotStore(lambda b: _versions(sched, b, P), _horizon(sched))
    state = run.restore(trainer, store) if resume else run.fresh(trainer, store)
    if resume:
        _check_continuable(sched, store, state, trainer.version, cfg.steps, n_batches, P)
        run.save_config()  # only now: a setting that cannot continue leaves config.yaml as it was
    record_session(run.path, trainer.version, cfg.trainer_threads)  # environment.json: code and machine kind
    evaluator = build_evaluator(cfg, tokenizer, task)
    evaluator.prepare()
    check_context(cfg, trainer.model, tokenizer, [*evaluator.pool, *_first_batch(task, cfg.seed, P)])
    if trainer.version == 0 and evaluator.due(0, cfg.steps):  # the base score: the eval collapse rule's reference
        run.log_eval(0, evaluator(trainer), trainer)
    backend = make_backend(cfg.backend, spec, **backend_options(cfg))
    try:
        for b in range(state.next_batch, n_batches):
            _submit_ready(backend, sched, store, state, trainer.version, b, n_batches, P)  # rollouts ahead
            t_wait = time.perf_counter()
            samples = state.ready.pop(b) if b in state.ready else backend.result(b)  # get the batch
            waited = time.perf_counter() - t_wait
            samples, dropped = _drop_stale(sched, samples, b)
            timeouts = sum(bool(s.meta.get("reward_timeout")) for s in samples)
            batch = collate(samples, pad_id(tokenizer))
            t0 = time.perf_counter()
            for metrics, rows in trainer.train_batch(batch, b, store.get, stop_at=cfg.steps):  # train it
                _push_weights(backend, sched, store, state, trainer, b, n_batches, P)
                metrics.update(batch_metrics(batch, rows, time.perf_counter() - t0, waited, dropped, backend))
                metrics["reward/timeouts"] = float(timeouts)  # graders that hit their time limit (reward 0)
                waited, dropped, timeouts = 0.0, 0, 0
                run.log_step(trainer.version, metrics)
                result = evaluator(trainer) if evaluator.due(trainer.version, cfg.steps) else None  # evaluate
                if result is not None:
                    run.log_eval(trainer.version, result, trainer)
                if on_step is not None:
                    on_step(trainer.version, metrics, result)
                t0 = time.perf_counter()
            state.next_batch = b + 1
            state.ready.update(backend.ready())
            if (b + 1) % cfg.checkpoint.every == 0 or b + 1 == n_batches:  # checkpoint
                run.checkpoint(trainer, store, state)
    finally:
        backend.close()
    return run.finish(trainer.version)


def _push_weights(backend, sched, store, state, trainer, b: int, n_batches: int, P: int) -> None:
    """Push the weights of the version just trained: keep them if a pending batch is generated by that version
    (the snapshot store drops the rest), then submit every batch whose generating version now exists. This
    is the only way weights reach the engine: each rollout request carries the weights it must use."""
    store.offer(trainer.version, trainer.weights, b)
    _submit_ready(backend, sched, store, state, trainer.version, b, n_batches, P)


def _versions(sched: Schedule, b: int, P: int) -> set[int]:
    return {sched.version(b, g) for g in range(P)}


def _horizon(sched: Schedule) -> int:
    """How many batches ahead of the one in training the loop may submit, and so how long a version may
    still be needed: a batch can be generated by weights up to ``max_lag`` optimizer steps older than the
    step that trains it, the trainer moves ``S`` steps per batch, and two more batches of slack (the one in
    training and the one being generated) keep the engine busy while the trainer works. In batches,
    rounded up, plus one."""
    return (sched.max_lag + 2 * sched.steps_per_batch + 1) // sched.steps_per_batch + 1


def _submit_ready(backend, sched, store, state, version: int, b_now: int, n_batches: int, P: int) -> None:
    """Submit, in order, every batch whose generating versions the trainer has reached."""
    last = min(n_batches, b_now + _horizon(sched) + 1)
    while state.next_submit < last:
        b = state.next_submit
        versions = [sched.version(b, g) for g in range(P)]
        if max(versions) > version:
            return
        if b not in state.ready:
            states = {v: store.get(v) for v in set(versions)}
            missing = [v for v, s in states.items() if s is None]
            if missing:
                raise RuntimeError(f"weights of version(s) {missing} needed by batch {b} were not kept")
            backend.submit(RolloutRequest(b, versions, states))
        state.next_submit += 1


def _check_continuable(sched, store, state, version: int, steps: int, n_batches: int, P: int) -> None:
    """Raise RunDirError (one line) if a resumed run cannot go on to ``steps`` (e.g. a changed ``steps=``)."""
    S, again = sched.steps_per_batch, f"resume with steps={version}, or start a new run for steps={steps}"
    if version > steps:
        raise RunDirError(f"steps={steps}: the run is already at step {version}; {again}")
    if version < steps and state.next_batch * S != version:
        raise RunDirError(f"steps={steps}: the run ended inside batch {state.next_batch - 1} (its steps are not a "
                          f"multiple of the {S} optimizer steps per batch), so it cannot be extended; {again}")  # fmt: skip
    for b in range(state.next_submit, min(n_batches, state.next_batch + _horizon(sched) + 1)):
        versions = {sched.version(b, g) for g in range(P)}
        if max(versions) > version:
            return
        missing = sorted(v for v in versions if store.get(v) is None)
        if b not in state.ready and missing:
            raise RunDirError(f"steps={steps}: the weights of version(s) {missing} that batch {b} is generated with "
                              f"were not kept by the run's last checkpoint; {again}")  # fmt: skip


def _drop_stale(sched: Schedule, samples: list, b: int) -> tuple[list, int]:
    """Under ``async``, drop samples whose lag at the batch's last optimizer step exceeds the bound."""
    last_version = sched.first_step(b) + sched.steps_per_batch - 1
    keep = [s for s in samples if not sched.drop(last_version - s.version)]
    return keep, len(samples) - len(keep)


def _first_batch(task, seed: int, P: int) -> list:
    """The first batch's problems, or none if the task cannot serve them (the engine process then says why)."""
    try:
        return list(itertools.islice(task.problems("train", seed), P))
    except ValueError:
        return []
