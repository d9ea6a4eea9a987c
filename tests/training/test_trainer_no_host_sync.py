"""A training step's microbatch loop never waits for the device: between the first forward's embedding and the
last backward's embedding gradient, no op reads a value on the host (``aten::_local_scalar_dense``: ``.item()``,
``int()``, ``bool()`` of a tensor) or sizes its output by the data (``nonzero`` and friends). Recorded on CPU with
a ``TorchDispatchMode``, which sees every aten op in order; on CUDA the same ops would each stall the stream."""

import pytest
import torch
from test_trainer import make_batch
from torch.utils._python_dispatch import TorchDispatchMode

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import resolve_objective
from satrl.training import scorer as scorer_mod
from satrl.training.microbatches import microbatches
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer

SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
           "repeat_interleave", "masked_scatter"}  # fmt: skip


class OrderedRecorder(TorchDispatchMode):
    """Every aten op, in dispatch order (forward, then the backward's ops)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def loop_syncs(trainer: Trainer, batch) -> list[str]:
    """The syncing ops recorded inside the microbatch loop of one ``step``."""
    rec = OrderedRecorder()
    with rec:
        trainer.step(batch, torch.linspace(-1, 1, batch.mask.shape[0]))
    first = rec.ops.index("embedding")
    last = len(rec.ops) - 1 - rec.ops[::-1].index("embedding_dense_backward")
    return [op for op in rec.ops[first:last] if op in SYNCING]


CASES = [
    ("sat_grpo", {}),  # SAT: gate, order statistic, PPO clip
    ("grpo", {"kl_coef": 1e-3}),  # with the reference model's forward
    ("sat_grpo", {"logprob_chunk_tokens": 8, "activation_checkpointing": True}),
    ("grpo", {"kl_coef": 1e-3, "dtype": "bf16", "logprob_chunk_tokens": 8, "activation_checkpointing": True}),
]


@pytest.mark.parametrize("preset,opts", CASES)
def test_microbatch_loop_has_no_host_sync(tiny, preset, opts):
    model, tok = tiny
    kw = {k: v for k, v in opts.items() if k != "kl_coef"}
    obj = resolve_objective(preset, **({"kl_coef": opts["kl_coef"]} if "kl_coef" in opts else {}))
    trainer = Trainer(model, obj, TrainerSettings(lr=1e-3, microbatch_tokens=40, **kw))
    batch = make_batch(tok, n=12, seed=1)
    assert len(list(microbatches(batch, 40))) >= 3  # several microbatches, rows of different lengths
    assert loop_syncs(trainer, batch) == []


def test_the_loop_check_can_fail(tiny, monkeypatch):
    """Without the host-side lengths (the step before this change: each forward read its longest row on the
    host, and transformers looked at the padding mask there), the recorder finds the syncs."""
    model, tok = tiny
    real = scorer_mod.response_logp

    def unplanned(*args, length=None, padded=None, **kw):
        return real(*args, **kw)

    monkeypatch.setattr(scorer_mod, "response_logp", unplanned)
    trainer = Trainer(model, resolve_objective("sat_grpo"), TrainerSettings(lr=1e-3, microbatch_tokens=40))
    assert "_local_scalar_dense" in loop_syncs(trainer, make_batch(tok, n=12, seed=1))
