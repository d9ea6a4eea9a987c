"""What a data-parallel rank other than 0 holds where rank 0 holds the run directory, the engine and the
evaluator: stand-ins with the methods the training loop calls (:func:`satrl.loop.orchestrator.train`), which
do nothing, or give what rank 0 broadcast (the plan and each batch, through the rank's
:class:`~satrl.launch.data_parallel.Follower`). Every rank runs the same loop; only rank 0 reads and
writes the run's files, generates and evaluates. The builders (:mod:`satrl.launch.setup`) choose them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from satrl.launch.data_parallel import Follower
from satrl.pipeline.buffer import Taken
from satrl.rundir.files import Loaded, RunState


class NoRunDir:
    """The run directory on the other ranks: rank 0 alone reads and writes it. A resumed run's checkpoint is
    rank 0's; :meth:`load` gives what the other ranks apply of it (whether there is one and its batch come with the
    plan; the policy and the optimizer come from the shards, the version with the next sync point)."""

    def __init__(self, ranks: Follower) -> None:
        self.ranks = ranks
        self.stepped = False  # nothing here to abandon
        self.skipped_rows = 0
        self.changes: dict[str, list] = {}

    def load(self) -> Loaded | None:
        plan = self.ranks.plan
        if not plan.resume:
            return None
        state = RunState(next_batch=plan.next_batch)  # this rank's own RNG and counters stay as they are
        return Loaded(None, {}, {"version": 0, "skipped": 0}, {}, torch.get_rng_state(), state, 0.0)

    def fresh(self) -> RunState:
        return RunState()

    def check_config(self, loaded: Loaded) -> int:
        return 0  # rank 0 checks it (the planned steps only feed checks the stand-in rollouts skip)

    def checkpoint(self, step: int, weights: dict, payload: dict, write_extra=None) -> None:
        """Every rank writes its shards into the checkpoint folder rank 0 names."""
        if write_extra is not None:
            write_extra(None)

    def finish(self, last_step: int) -> None:
        return None  # rank 0 writes and returns the summary

    def check_unstarted(self) -> None:
        pass

    def save_config(self) -> None:
        pass

    def record_session(self, version: int, threads: int) -> None:
        pass

    def resume_at(self, step: int, state: RunState, wall_s: float, due=None) -> None:
        pass

    def log_step(self, step: int, metrics: dict) -> None:
        pass

    def log_eval(self, step: int, result: dict) -> None:
        pass

    def abandon(self) -> None:
        pass

    def release(self) -> None:
        pass


class ReceivedStore:
    """The snapshot store as the other ranks see it: the versions rank 0's held when it sent the batch in training.
    A version it holds is ``{}`` here: rank 0's weights come inside the swap's collectives."""

    def __init__(self) -> None:
        self.states: set[int] = set()

    def state(self, version: int) -> dict | None:
        return {} if version in self.states else None

    def wants(self, version: int, b_training: int) -> bool:
        return False  # rank 0 decides at the sync point whether every rank gathers the weights

    def saved(self) -> dict:
        return {}


class ReceivedRollouts:
    """The rollouts on the other ranks: no engine, no schedule; :meth:`take` gives the batch rank 0 sends."""

    def __init__(self, ranks: Follower) -> None:
        self.ranks, self.store, self.state = ranks, ReceivedStore(), RunState()

    def fresh(self, state: RunState) -> None:
        self.state = state

    def restore(self, loaded: Loaded, version: int) -> None:
        self.state = loaded.run

    @contextmanager
    def running(self, backend) -> Iterator[ReceivedRollouts]:
        yield self  # the backend is rank 0's: never built here

    def take(self, b: int) -> Taken:
        got = self.ranks.batch()
        if got.index != b:
            raise RuntimeError(f"data parallel: rank 0 sent batch {got.index} where this rank trains batch {b}")
        self.store.states = got.held
        return Taken(got.batch, 0.0, 0, 0, 0)

    def check_continuable(self, version: int, steps: int, planned: int) -> None:
        pass

    def submit_ready(self, version: int, b_now: int) -> None:
        pass

    def trained(self, version: int, b_training: int) -> None:
        pass

    def collect(self) -> None:
        pass

    def engine_metrics(self) -> dict[str, float]:
        return {}


class NoEvaluator:
    """The evaluator on the other ranks: rank 0 evaluates (on the weights every rank gathered when due)."""

    pool = ()  # no problems for the up-front context check

    def due(self, step: int, last: int) -> bool:
        return False

    def prepare(self) -> None:
        pass

    def __call__(self, trainer) -> dict:
        raise RuntimeError("data parallel: only rank 0 evaluates")
