"""Routing capture and replay (R3) on a tiny Qwen3-MoE."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import EOS, PAD, make_requests, sampled_ref_logp, tiny_model

from run_helpers import collated_routing
from satrl.engines import EngineSpec, TorchEngine
from satrl.models.routing import (
    capture_routing,
    moe_num_layers,
    moe_top_k,
    replay_gate,
    replay_routing,
)
from satrl.types import SamplingParams


def _ids(b=3, length=9, seed=0):
    return torch.randint(2, 40, (b, length), generator=torch.Generator().manual_seed(seed))


def test_layer_and_topk_counts(dense, moe):
    assert (moe_num_layers(moe), moe_top_k(moe)) == (2, 2)
    assert (moe_num_layers(dense), moe_top_k(dense)) == (0, 0)
    with pytest.raises(ValueError, match="no MoE router"), capture_routing(dense):
        pass


def test_capture_equals_topk_of_router_logits(moe):
    ids = _ids()
    with torch.no_grad(), capture_routing(moe) as rec:
        out = moe(ids, output_router_logits=True)
    routing = rec.take()
    assert routing.shape == (3, 9, 2, 2) and routing.dtype == torch.int64
    for layer, logits in enumerate(out.router_logits):  # [B*L, E] per layer, recorded by HF itself
        expect = torch.topk(torch.softmax(logits.float(), -1), 2, dim=-1).indices.view(3, 9, 2)
        assert torch.equal(routing[:, :, layer], expect)


def test_replay_gate_by_hand():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    idx = torch.tensor([[3, 0]])

    class Router(torch.nn.Module):
        norm_topk_prob = True

    w = replay_gate(Router(), logits, idx, torch.float32)
    assert torch.allclose(w, torch.tensor([[0.8, 0.2]]))  # 0.4 / 0.5, 0.1 / 0.5
    Router.norm_topk_prob = False
    assert torch.allclose(replay_gate(Router(), logits, idx, torch.float32), torch.tensor([[0.4, 0.1]]))


def test_replaying_own_routing_is_bit_identical(moe):
    ids = _ids()
    with torch.no_grad():
        plain = moe(ids).logits
        with capture_routing(moe) as rec:
            moe(ids)
        own = rec.take()
        partial = own.clone()
        partial[:, :4] = -1  # unknown positions fall back to the model's own top-k
        for routing in (own, partial):
            with replay_routing(moe, routing):
                assert torch.equal(moe(ids).logits, plain)


def test_replay_uses_the_given_experts_and_router_gets_gradient():
    model = tiny_model("moe")
    ids = _ids()
    with torch.no_grad(), capture_routing(model) as rec:
        plain = model(ids).logits
    forced = (rec.take() + 3) % 8  # other experts (still distinct within a token)
    with capture_routing(model) as rec2, replay_routing(model, forced):
        logits = model(ids).logits
    assert torch.equal(rec2.take(), forced)  # a recorder entered before replay still sees the experts used
    assert not torch.allclose(logits, plain)
    torch.log_softmax(logits, -1)[..., 7].sum().backward()
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    assert len(routers) == 2
    for r in routers:
        assert r.weight.grad is not None and r.weight.grad.abs().sum() > 0


def test_replay_shape_errors(moe):
    ids = _ids()
    with (
        pytest.raises(ValueError, match="layers=2, top_k=2"),
        replay_routing(moe, torch.zeros(3, 9, 2, 3, dtype=torch.long)),
    ):
        pass
    with (
        pytest.raises(ValueError, match="aligned with the input_ids"),
        replay_routing(moe, torch.zeros(3, 8, 2, 2, dtype=torch.long)),
    ):
        moe(ids)


def test_collate_places_response_routing_at_the_scoring_positions():
    """Response token t of a row is scored (and its experts chosen) at input position prompt_len - 1 + t."""
    from satrl.pipeline.buffer import collate
    from satrl.types import Sample

    r0 = torch.arange(3 * 2 * 2).view(3, 2, 2)
    rows = [Sample("a", "g", [5, 6], [7, 8, 9], torch.zeros(3), 0, 0.0, routing=r0),
            Sample("b", "g", [5, 6, 7, 8], [9], torch.zeros(1), 0, 0.0, routing=r0[:1] + 100)]  # fmt: skip
    out = collate(rows, pad_id=0).routing
    assert out.shape == (2, 5, 2, 2)
    assert torch.equal(out[0, 1:4], r0) and bool((out[0, [0, 4]] == -1).all())
    assert torch.equal(out[1, 3:4], r0[:1] + 100) and bool((out[1, :3] == -1).all())


def test_r3_replays_engine_routing_exactly(moe):
    """fp32 engine: replaying its routing in a full-sequence trainer forward reproduces behavior_logp.
    bf16 engine: the trainer's own routing disagrees; under replay it uses exactly the engine's."""
    sampling = SamplingParams(temperature=0.9, max_new_tokens=12)
    comps = TorchEngine(moe, EngineSpec(eos_token_id=EOS, pad_token_id=PAD, numerics="fp32")).generate(
        make_requests(7), sampling
    )
    P = [len(c.prompt_ids) for c in comps]
    L = max(p + len(c.response_ids) for p, c in zip(P, comps))
    routing = collated_routing(comps)
    assert routing.shape[1] == L
    ref = sampled_ref_logp(moe, comps, 0.9, routing=routing)
    assert (torch.cat([c.behavior_logp for c in comps]).double() - ref).abs().max() < 1e-5

    comps = TorchEngine(moe, EngineSpec(eos_token_id=None, pad_token_id=PAD, numerics="bf16")).generate(
        make_requests(48, min_len=5, max_len=5), SamplingParams(max_new_tokens=16)
    )
    ids = torch.tensor([c.prompt_ids + c.response_ids for c in comps])
    engine_routing = torch.stack([c.routing for c in comps])  # [B, 16, layers, k]
    routing = collated_routing(comps)
    assert routing.shape[1] == ids.shape[1]
    with torch.no_grad(), capture_routing(moe) as rec:
        moe(ids)
        own = rec.take()[:, 4:20]
        with replay_routing(moe, routing):
            moe(ids)
        used = rec.take()[:, 4:20]
    disagree = (own.sort(-1).values != engine_routing.sort(-1).values).any(-1).double().mean()
    print(f"bf16 engine vs fp32 trainer routing disagreement: {disagree:.4f} without R3, 0 with R3")
    assert disagree > 0 and torch.equal(used, engine_routing)
