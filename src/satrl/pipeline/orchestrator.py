"""The training loop, top to bottom: generate with a (stale) policy, train, broadcast, evaluate, checkpoint.

Read :func:`train` first; everything else is a helper it calls. The lag schedule says which version
generates each batch; the loop submits a batch to the rollout backend as soon as that version exists, so the
engine works while the trainer trains, and a concurrent run equals a sequential one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch

from satrl.config import RunConfig
from satrl.pipeline.backends import make_backend
from satrl.pipeline.buffer import SnapshotStore, collate
from satrl.pipeline.rundir import Evaluator, RunDir, batch_metrics
from satrl.pipeline.schedules import Schedule, make_schedule
from satrl.pipeline.setup import build_trainer, worker_spec
from satrl.pipeline.worker import RolloutRequest, WorkerSpec
from satrl.tasks import make_task
from satrl.training.advantages import group_advantages
from satrl.training.trainer import split_rows


def train(cfg: RunConfig, resume: bool = False, on_step: Callable[[int, dict, dict | None], None] | None = None) -> dict:
    """Run (or resume) one training run; returns its summary (also written to ``summary.json``)."""
    # A grid running W runs at once caps each run's threads (W x threads <= cores) through this variable.
    torch.set_num_threads(min(cfg.train.threads, int(os.environ.get("SATRL_TORCH_THREADS", cfg.train.threads))))
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg, resume=resume)
    task = make_task(cfg.task.name, **cfg.task.kwargs)  # here too, so bad data fails before any engine starts
    run.skipped_rows = len(getattr(task, "skipped", ()))
    trainer, tokenizer = build_trainer(cfg)
    spec: WorkerSpec = worker_spec(cfg)
    S, P = cfg.steps_per_batch, cfg.train.prompts_per_batch
    n_batches = math.ceil(cfg.steps / S)
    sched = make_schedule(cfg.lag.schedule, S, cfg.lag.n, cfg.lag.max_staleness, cfg.seed)
    store = SnapshotStore(lambda b: _versions(sched, b, P) if b < n_batches else set(), _horizon(sched))
    state = run.restore(trainer, store) if resume else run.fresh(trainer, store)
    evaluator = Evaluator(cfg, tokenizer, task)
    evaluator.prepare()
    if trainer.version == 0 and evaluator.due(0, cfg.steps):  # the base score: the eval collapse rule's reference
        run.log_eval(0, evaluator(trainer), trainer)
    backend = make_backend(cfg.backend, spec)
    try:
        for b in range(state.next_batch, n_batches):
            _submit_ready(backend, sched, store, state, trainer.version, b, n_batches, P)
            t_wait = time.perf_counter()
            samples = state.ready.pop(b) if b in state.ready else backend.result(b)
            waited = time.perf_counter() - t_wait
            samples, dropped = _drop_stale(sched, samples, b)
            timeouts = sum(bool(s.meta.get("reward_timeout")) for s in samples)
            batch = collate(samples, tokenizer.pad_token_id)
            adv = group_advantages(batch.rewards, batch.group_index, cfg.train.adv_std_norm)
            old_logp = trainer.logp_with(None, batch) if trainer.needs_old_logp else None
            vlogp = trainer.version_logp(batch, store.get) if cfg.diagnostics.decompose else None
            for epoch in range(cfg.train.ppo_epochs):
                if trainer.version >= cfg.steps:
                    break
                perm = torch.randperm(len(samples), generator=torch.Generator().manual_seed(cfg.seed * 7919 + b * 31 + epoch))
                for rows in torch.tensor_split(perm, cfg.train.minibatches):
                    t0 = time.perf_counter()
                    metrics = trainer.step(split_rows(batch, rows), adv[rows], _pick(old_logp, rows), _pick(vlogp, rows))
                    store.offer(trainer.version, trainer.weights, b)
                    _submit_ready(backend, sched, store, state, trainer.version, b, n_batches, P)
                    metrics.update(batch_metrics(batch, rows, time.perf_counter() - t0, waited, dropped, backend))
                    metrics["reward/timeouts"] = float(timeouts)  # graders that hit their time limit (reward 0)
                    waited, dropped, timeouts = 0.0, 0, 0
                    run.log_step(trainer.version, metrics)
                    result = evaluator(trainer) if evaluator.due(trainer.version, cfg.steps) else None
                    if result is not None:
                        run.log_eval(trainer.version, result, trainer)
                    if on_step is not None:
                        on_step(trainer.version, metrics, result)
                    if trainer.version >= cfg.steps:
                        break
            state.next_batch = b + 1
            state.ready.update(backend.ready())
            if (b + 1) % cfg.checkpoint.every == 0 or b + 1 == n_batches:
                run.checkpoint(trainer, store, state)
    finally:
        backend.close()
    return run.finish()


def _pick(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if x is None else x[rows]


def _versions(sched: Schedule, b: int, P: int) -> set[int]:
    return {sched.version(b, g) for g in range(P)}


def _horizon(sched: Schedule) -> int:
    """How many batches ahead of the one in training a version may still be needed."""
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


def _drop_stale(sched: Schedule, samples: list, b: int) -> tuple[list, int]:
    """Under ``async``, drop samples whose lag at the batch's last optimizer step exceeds the bound."""
    last_version = sched.first_step(b) + sched.steps_per_batch - 1
    keep = [s for s in samples if not sched.drop(last_version - s.version)]
    return keep, len(samples) - len(keep)
