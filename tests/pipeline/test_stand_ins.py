"""One loop on every rank (issue 61): the other data-parallel ranks' run directory, rollouts and evaluator are
stand-ins that do nothing or give what rank 0 broadcast, and no module keeps rank or data-parallel state."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from satrl.launch.data_parallel import Leader, OneProcess, Plan, Received, following
from satrl.launch.setup import build_evaluator, build_run_dir
from satrl.launch.stand_ins import NoEvaluator, NoRunDir, ReceivedRollouts
from satrl.types import Batch

SRC = Path(__file__).resolve().parents[2] / "src" / "satrl"


def _channel(plan: Plan, sent: list[Received] = ()) -> SimpleNamespace:
    """A rank other than 0's channel, as its stand-ins read it: the plan it received, then the batches."""
    queue = list(sent)
    return SimpleNamespace(rank0=False, ctx=object(), plan=plan, batch=lambda: queue.pop(0))


def _batch() -> Batch:
    ids = torch.tensor([[1, 2, 3]])
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=torch.tensor([1]),
                 mask=torch.ones(1, 2), response_ids=ids[:, 1:], behavior_logp=torch.zeros(1, 2),
                 versions=torch.zeros(1, 2, dtype=torch.long), rewards=torch.ones(1),
                 group_index=torch.zeros(1, dtype=torch.long))  # fmt: skip


def test_the_builders_give_stand_ins_on_the_other_ranks_only(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    other = _channel(Plan(False, 0))
    assert isinstance(build_run_dir(cfg, False, other), NoRunDir)
    assert isinstance(build_evaluator(cfg, None, None, other), NoEvaluator)
    assert not cfg.run_dir().exists()  # the other ranks never touch the run folder
    assert isinstance(following(None), OneProcess) and following(None).rank0
    assert isinstance(following(SimpleNamespace(leader=True)), Leader)


def test_the_run_folder_stand_in_resumes_where_the_plan_says():
    assert NoRunDir(_channel(Plan(False, 0))).load() is None  # rank 0 starts from scratch
    loaded = NoRunDir(_channel(Plan(True, 7))).load()
    assert loaded.run.next_batch == 7 and loaded.weights == {} and loaded.path is None
    assert torch.equal(loaded.rng, torch.get_rng_state())  # this rank's RNG goes on as it was
    shards = []
    NoRunDir(_channel(Plan(True, 7))).checkpoint(3, {}, {}, write_extra=shards.append)
    assert shards == [None]  # every rank writes its shards, into the folder rank 0 names


def test_the_rollouts_stand_in_gives_rank_0s_batch_and_held_versions():
    batch = _batch()
    rollouts = ReceivedRollouts(_channel(Plan(False, 0), [Received(batch, 4, {1, 3}), Received(batch, 9, set())]))
    with rollouts.running(lambda: pytest.fail("the other ranks never build a backend")):
        got = rollouts.take(4)
        assert got.batch is batch and (got.dropped, got.held, got.timeouts) == (0, 0, 0)
        assert [rollouts.store.state(v) for v in (1, 2, 3)] == [{}, None, {}]
        assert not rollouts.store.wants(3, 4) and rollouts.engine_metrics() == {}
        with pytest.raises(RuntimeError, match="rank 0 sent batch 9 where this rank trains batch 5"):
            rollouts.take(5)


def test_no_module_keeps_rank_or_data_parallel_state():
    """The data-parallel context and rank 0's channel are passed explicitly: no ``global`` statement in the
    pipeline or the training code, and neither ``dp.current`` nor ``data_parallel.follow`` is back."""
    rebound = [f"{p.relative_to(SRC)}:{n.lineno}" for folder in ("pipeline", "training")
               for p in sorted((SRC / folder).rglob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Global)]  # fmt: skip
    assert rebound == []
    from satrl.launch import data_parallel
    from satrl.training import dp

    assert not hasattr(dp, "current") and not hasattr(data_parallel, "follow")
