"""In-flight weight updates inside the torch engine's decoding loop (``switch``, lag.inflight_every)."""

from __future__ import annotations

import torch
from engine_helpers import EOS, PAD, make_requests, tiny_model

from satrl.engines import EngineSpec
from satrl.engines.torch_engine import TorchEngine
from satrl.pipeline.schedules import inflight_version, inflight_versions
from satrl.types import SamplingParams

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10)
K = 4


def _switcher(engine: TorchEngine, states: dict[int, dict], start: int, cap: int):
    def switch(t: int) -> None:
        v = inflight_version(start, cap, K, t)
        if engine.version != v:
            engine.load_weights(states[v], v)

    return switch


def test_rule_moves_one_version_per_k_tokens_up_to_the_cap():
    assert [inflight_version(3, 5, 4, t) for t in range(14)] == [3] * 4 + [4] * 4 + [5] * 6
    assert [inflight_version(3, 9, 0, t) for t in range(6)] == [3] * 6, "0 = off"
    assert inflight_version(5, 5, 1, 7) == 5, "a group started at the cap never moves"
    assert inflight_versions(3, 5, 4, 6) == {3, 4} and inflight_versions(3, 5, 4, 1) == {3}


def test_switching_to_the_same_weights_changes_no_token(dense):
    """Only the version label moves when the weights do not: the KV cache is kept across a switch."""
    reqs = make_requests(6, max_len=5)
    plain = TorchEngine(dense, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, numerics="fp32"), max_batch_size=4).generate(reqs, SAMPLING)
    engine = TorchEngine(dense, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, numerics="fp32"), max_batch_size=4)
    state = dense.state_dict()
    got = engine.generate(reqs, SAMPLING, switch=_switcher(engine, {0: state, 1: state, 2: state}, 0, 2))
    for a, b in zip(plain, got):
        assert a.response_ids == b.response_ids and torch.equal(a.behavior_logp, b.behavior_logp)
        n = len(b.response_ids)
        assert b.token_versions.tolist() == [min(t // K, 2) for t in range(n)]
        assert b.version == 0 and a.token_versions is None


def test_new_weights_take_over_at_the_switch(dense):
    """Tokens before step K come from the old weights, identical to a run without switching; after it, from the
    new weights; a second chunk (max_batch_size) starts again on the start version."""
    reqs = make_requests(6, max_len=5)
    other = tiny_model("dense", seed=1).state_dict()
    plain = TorchEngine(dense, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, numerics="fp32"), max_batch_size=4).generate(reqs, SAMPLING)
    engine = TorchEngine(dense, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, numerics="fp32"), max_batch_size=4)
    got = engine.generate(reqs, SAMPLING, switch=_switcher(engine, {0: dense.state_dict(), 1: other}, 0, 1))
    moved = 0
    for a, b in zip(plain, got):
        k = min(K, len(a.response_ids), len(b.response_ids))
        assert a.response_ids[:k] == b.response_ids[:k]
        assert torch.equal(a.behavior_logp[:k], b.behavior_logp[:k])
        moved += len(b.response_ids) > K and not torch.equal(a.behavior_logp[K : K + 1], b.behavior_logp[K : K + 1])
        assert set(b.token_versions[K:].tolist()) <= {1} and set(b.token_versions[:K].tolist()) == {0}
    assert moved > 0, "no response crossed the switch with different weights"
