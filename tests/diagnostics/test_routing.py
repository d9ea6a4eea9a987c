import pytest
import torch

from satrl.diagnostics import routing_disagreement


def test_routing_disagreement_hand_values():
    # [B=1, T=3, layers=2, top_k=2]; token 2 is padding with garbage routing
    engine = torch.tensor([[[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[-1, -1], [-1, -1]]]])
    trainer = torch.tensor([[[[1, 0], [2, 4]], [[5, 3], [1, 0]], [[0, 1], [2, 3]]]])
    mask = torch.tensor([[True, True, False]])
    r = routing_disagreement(engine, trainer, mask)
    # pairs: (t0,l0) same set (order ignored), (t0,l1) differ, (t1,l0) differ, (t1,l1) differ
    assert r["route_disagree"].item() == 0.75
    assert r["route_disagree/layer0"].item() == 0.5
    assert r["route_disagree/layer1"].item() == 1.0
    # experts not shared out of 2: t0: 0, 0.5; t1: 0.5, 1.0 -> mean 0.5
    assert r["expert_diff"].item() == 0.5


def test_identical_routing_is_zero_and_shapes_checked():
    g = torch.Generator().manual_seed(0)
    routing = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(2 * 5 * 4)]).view(2, 5, 4, 2)
    mask = torch.ones(2, 5, dtype=torch.bool)
    r = routing_disagreement(routing, routing.flip(-1), mask)
    assert r["route_disagree"].item() == 0.0 and r["expert_diff"].item() == 0.0
    with pytest.raises(ValueError, match="top_k"):
        routing_disagreement(routing, routing[..., :1], mask)
    with pytest.raises(ValueError, match="mask"):
        routing_disagreement(routing, routing, mask[:, :3])
