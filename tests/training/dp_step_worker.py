"""Run by test_dp_trainer.py under torchrun: one optimizer step of the data-parallel trainer against the
one-device trainer, on the same tiny policy and batch. Rank 0 writes what it saw to the JSON file argv[1]."""

import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_batch, the op recorder

from test_trainer import make_batch  # noqa: E402
from test_trainer_no_host_sync import SYNCING, OrderedRecorder  # noqa: E402

from satrl.models import build_char_tokenizer, build_tiny_model, meta_copy  # noqa: E402
from satrl.objectives import resolve_objective  # noqa: E402
from satrl.training import dp  # noqa: E402
from satrl.training import dp_calls as calls  # noqa: E402
from satrl.training.dp_trainer import DPTrainer  # noqa: E402
from satrl.training.microbatches import plan_microbatches  # noqa: E402
from satrl.training.placement import cpu_copy  # noqa: E402
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer  # noqa: E402

CASES = [40, 60, 1 << 20]  # microbatch token budgets: 3+ microbatches (odd: padding), several, one (padding only)


def leader_trainer(ctx, model, obj, kw: dict) -> DPTrainer | None:
    """Rank 0's DPTrainer; on the other ranks, build the same trainer, serve rank 0's announced calls until it
    stops, and return None."""
    if not ctx.leader:
        assert isinstance(calls.decode(ctx.channel.recv()), calls.Start)
    # The other ranks start from the architecture on the meta device, as `satrl train` under torchrun does:
    # every weight they train with comes from rank 0.
    mine = copy.deepcopy(model) if ctx.leader else meta_copy(model)
    trainer = DPTrainer(mine, obj, TrainerSettings(**kw), dp=ctx, template=lambda: None)
    if ctx.leader:
        return trainer
    trainer.serve()
    return None


def loop_syncs(ops: list[str]) -> list[str]:
    """Syncing ops between the first forward's embedding and the last backward's embedding gradient."""
    first = ops.index("embedding")
    last = len(ops) - 1 - ops[::-1].index("embedding_dense_backward")
    return [op for op in ops[first:last] if op in SYNCING]


def main(out: str) -> None:
    torch.set_num_threads(1)
    ctx = dp.init("cpu")
    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    batch = make_batch(tok, n=12, seed=1)
    adv = torch.linspace(-1, 1, 12)
    results = []
    for budget in CASES:
        kw = {"lr": 1e-2, "microbatch_tokens": budget}
        obj = resolve_objective("sat_grpo", kl_coef=1e-3)  # with a sharded reference model too
        trainer = leader_trainer(ctx, model, obj, kw)
        if trainer is None:
            continue
        one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
        rec = OrderedRecorder()
        with rec:  # FSDP's collectives included: nothing in the microbatch loop may wait for the device
            got = trainer.step(batch, adv)
        want = one.step(batch, adv)
        per_mb = [[{k: float(v) for k, v in m.items()} for m in t.microbatch_metrics] for t in (trainer.trainer, one)]
        full, ref = trainer.weights(), cpu_copy(one.model)
        calls.announce(ctx.channel, calls.Stop())
        results.append({
            "microbatches": len(plan_microbatches(batch, budget)),
            "per_mb": per_mb, "metrics": [got, want],
            "max_weight_diff": max(float((full[k] - ref[k]).abs().max()) for k in ref),
            "keys_equal": sorted(full) == sorted(ref),
            "loop_syncs": loop_syncs(rec.ops),
        })  # fmt: skip
    scaled = scaled_step(ctx, model, batch, adv)
    refused = mismatched_architecture(ctx, model)
    if ctx.leader:
        Path(out).write_text(json.dumps({"cases": results, "refused": refused, "scaled": scaled}))
    dp.shutdown()


def scaled_step(ctx, model, batch, adv) -> dict | None:
    """The step-size seam under data parallel: VCPO's ESS rule times lr / sqrt(S) at lag 4, with three
    microbatches (rank 1 holds one real and one padding). Each rank steps its own shards with the lr it computed from
    the gathered tokens, so the full weights equal one device's only if every rank used the same scale."""
    kw = {"lr": 1e-2, "microbatch_tokens": 60, "lr_lag_scaling": "inverse_sqrt"}
    obj = resolve_objective("vcpo", baseline="group_mean")
    trainer = leader_trainer(ctx, model, obj, kw)
    if trainer is None:
        return None
    one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
    trainer.version = one.version = 4
    got, want = trainer.step(batch, adv), one.step(batch, adv)
    full, ref = trainer.weights(), cpu_copy(one.model)
    calls.announce(ctx.channel, calls.Stop())
    return {"metrics": [got, want], "max_weight_diff": max(float((full[k] - ref[k]).abs().max()) for k in ref),
            "moved": max(float((ref[k] - v).abs().max()) for k, v in cpu_copy(model).items()),
            "lr_after": trainer.trainer.opt.param_groups[0]["lr"]}  # fmt: skip


def mismatched_architecture(ctx, model) -> str:
    """Rank 1 passes a meta copy made with `Module.to("meta")`, which unties the LM head: every rank must refuse
    it when the trainer is built, instead of hanging in a collective. Returns the error (or "" if none)."""
    if not ctx.leader:
        assert isinstance(calls.decode(ctx.channel.recv()), calls.Start)
    mine = copy.deepcopy(model) if ctx.leader else copy.deepcopy(model).to("meta")
    try:
        DPTrainer(mine, resolve_objective("sat_grpo"), TrainerSettings(lr=1e-2), dp=ctx, template=lambda: None)
    except ValueError as e:
        return str(e)
    return ""


if __name__ == "__main__":
    main(sys.argv[1])
