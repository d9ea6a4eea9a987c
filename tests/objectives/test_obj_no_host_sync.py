"""SAT's training path has no host sync: no op whose result the host must read (``.item()``, ``bool()``,
``int()`` of a tensor, i.e. ``aten::_local_scalar_dense``) and no op whose output shape depends on the data
(``nonzero``, ``masked_select``, ...), which on CUDA waits for the device. Checked on CPU by recording every
aten op the objective dispatches (a ``TorchDispatchMode``), forward and backward."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from satrl.objectives import aggregate, resolve_objective

SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
           "repeat_interleave", "masked_scatter"}  # fmt: skip


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def _inputs(seed=0, B=40, T=10):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    blp = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    return logp, blp, torch.randn(B, generator=g), mask


@pytest.mark.parametrize("preset,over", [("sat_grpo", {}), ("sat_gspo", {}), ("sat_grpo", {"proxy": "prob_diff"}),
                                         ("sat_grpo", {"invert": True}), ("grpo", {}), ("sat_grpo_tis", {})])
def test_objective_dispatches_no_syncing_op(preset, over):
    spec = resolve_objective(preset, **over)
    logp, blp, adv, mask = _inputs()
    rec = Recorder()
    with rec:
        out = spec(logp=logp, behavior_logp=blp, adv=adv, mask=mask, old_logp=blp + 0.01)
        aggregate(out.loss, mask, "token-mean").backward()
    assert out.tokens.gate.any() or preset == "grpo" or over.get("invert")
    assert "topk" in rec.ops or preset == "grpo"  # the recorder saw the order statistic: it does record
    assert not (rec.ops & SYNCING), sorted(rec.ops & SYNCING)


def test_the_recorder_catches_a_sync():
    """The check can fail: .item() and nonzero are recorded."""
    rec = Recorder()
    with rec:
        x = torch.ones(3)
        x.sum().item()
        x.nonzero()
    assert {"_local_scalar_dense", "nonzero"} <= rec.ops
