"""Run by test_weights.py under torchrun (2 ranks, gloo): after one optimizer step of the data-parallel trainer
(so FSDP may hold its root gathered), every rank gathers the weights at a sync point, as `satrl train` does
(launch.data_parallel), and rank 0's ``WeightExport.buckets`` (cut from that copy) gives the full
weights, equal to the one-device trainer's after the same step to the rounding of the gradient sum's order.
Before the sync point, asking for them is refused on every rank (a gather the others did not enter would hang).
Rank 0 writes what it saw to the JSON file argv[1]."""

import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # make_batch, sharded_trainer

from dp_step_worker import sharded_trainer  # noqa: E402
from test_trainer import make_batch  # noqa: E402

from satrl.launch.data_parallel import gather_weights  # noqa: E402
from satrl.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from satrl.objectives import resolve_objective  # noqa: E402
from satrl.training import dp  # noqa: E402
from satrl.training.settings import TrainerSettings  # noqa: E402
from satrl.training.trainer import Trainer  # noqa: E402
from satrl.weights.buckets import aliases, unpack  # noqa: E402


def refused(ask) -> str:
    """The error of ``ask()`` outside a sync point ("" if it returned)."""
    try:
        ask()
    except RuntimeError as e:
        return str(e)
    return ""


def main(out: str) -> None:
    torch.set_num_threads(1)
    ctx = dp.init("cpu")
    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    batch, adv = make_batch(tok, n=8, seed=1), torch.linspace(-1, 1, 8)
    kw = {"lr": 1e-2, "microbatch_tokens": 60}
    obj = resolve_objective("grpo")
    trainer = sharded_trainer(ctx, model, obj, kw)
    trainer.step(batch, adv)
    outside = [refused(trainer.export.weights), refused(lambda: list(trainer.export.buckets(None, 4096)))]
    gather_weights(trainer)  # every rank, together
    if not ctx.leader:
        dp.shutdown(ctx)
        return
    one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
    one.step(batch, adv)
    streams = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        streams[name] = unpack(list(trainer.export.buckets(dtype, 4096)), aliases(trainer.model))
    ref = one.model.state_dict()
    fp32, bf16 = streams["fp32"], streams["bf16"]
    report = {
        "keys_equal": fp32.keys() == ref.keys() == bf16.keys(),
        "max_diff": max(float((fp32[k] - ref[k]).abs().max()) for k in ref),
        "bf16_is_rounded_fp32": all(torch.equal(bf16[k], fp32[k].to(torch.bfloat16)) for k in ref),
        "bf16_dtypes": sorted({str(t.dtype) for t in bf16.values()}),
        "tied": aliases(trainer.model),
        "outside_sync": outside,
    }
    Path(out).write_text(json.dumps(report))
    dp.shutdown(ctx)


if __name__ == "__main__":
    main(sys.argv[1])
