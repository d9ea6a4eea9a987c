"""Run by test_dp_trainer.py under torchrun: one optimizer step of the data-parallel trainer against the
one-device trainer, on the same tiny policy and batch. Every rank runs the same code on its own trainer (SPMD, as
`satrl train` under torchrun does: launch.data_parallel); rank 0 sends the batch, checks against one
device and writes what it saw to the JSON file argv[1]."""

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_batch, the op recorder

from test_trainer import make_batch  # noqa: E402
from test_trainer_no_host_sync import SYNCING, OrderedRecorder  # noqa: E402

from satrl.launch.data_parallel import BATCH_FIELDS, Follower, Leader, gather_weights  # noqa: E402
from satrl.models import build_char_tokenizer, build_tiny_model, meta_copy  # noqa: E402
from satrl.objectives import resolve_objective  # noqa: E402
from satrl.training import dp  # noqa: E402
from satrl.training.microbatches import plan_microbatches  # noqa: E402
from satrl.training.placement import cpu_copy  # noqa: E402
from satrl.training.settings import TrainerSettings  # noqa: E402
from satrl.training.sharded import Sharded  # noqa: E402
from satrl.training.trainer import Trainer  # noqa: E402

CASES = [40, 60, 1 << 20]  # microbatch token budgets: 3+ microbatches (odd: padding), several, one (padding only)


def sharded_trainer(ctx, model, obj, kw: dict) -> Trainer:
    """This rank's trainer over FSDP2 shards, built as `satrl train` builds it (launch.setup.build_trainer).
    The other ranks start from the architecture on the meta device: every weight they train with comes from rank 0."""
    mine = copy.deepcopy(model) if ctx.leader else meta_copy(model)
    return Trainer(mine, obj, replace(TrainerSettings(**kw), device=ctx.device), Sharded(ctx, template=lambda: None))


def one_device(model, obj, kw: dict) -> Trainer:
    return Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))


def shared_batch(ctx, tok):
    """Rank 0's batch on every rank, sent as `satrl train` sends it (``Leader.train``), with its index and the
    versions rank 0's snapshot store holds. The others check that they got exactly its tensors."""
    batch = make_batch(tok, n=12, seed=1)
    if ctx.leader:
        Leader(ctx).train(batch, 3, {5, 2})
        return batch
    got = Follower(ctx).batch()
    assert (got.index, got.held) == (3, {2, 5})
    for f in BATCH_FIELDS:
        mine, theirs = getattr(batch, f), getattr(got.batch, f)
        assert (mine is None and theirs is None) or (mine.dtype == theirs.dtype and torch.equal(mine, theirs)), f
    return got.batch


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
    batch = shared_batch(ctx, tok)
    adv = torch.linspace(-1, 1, 12)
    results = []
    for budget in CASES:
        kw = {"lr": 1e-2, "microbatch_tokens": budget}
        obj = resolve_objective("sat_grpo", kl_coef=1e-3)  # with a sharded reference model too
        trainer = sharded_trainer(ctx, model, obj, kw)
        rec = OrderedRecorder()
        with rec:  # FSDP's collectives included: nothing in the microbatch loop may wait for the device
            got = trainer.step(batch, adv)
        gather_weights(trainer)  # every rank, as at a sync point
        if not ctx.leader:
            continue
        one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
        want = one.step(batch, adv)
        per_mb = [[{k: float(v) for k, v in m.items()} for m in t.microbatch_metrics] for t in (trainer, one)]
        full, ref = trainer.export.weights(), cpu_copy(one.model)
        results.append({
            "microbatches": len(plan_microbatches(batch, budget)),
            "per_mb": per_mb, "metrics": [got, want],
            "max_weight_diff": max(float((full[k] - ref[k]).abs().max()) for k in ref),
            "keys_equal": sorted(full) == sorted(ref),
            "loop_syncs": loop_syncs(rec.ops),
        })  # fmt: skip
    scaled = scaled_step(ctx, model, batch, adv)
    scores = opob_scores(ctx, tok, batch)
    refused = mismatched_architecture(ctx, model)
    if ctx.leader:
        Path(out).write_text(json.dumps({"cases": results, "refused": refused, "scaled": scaled, "scores": scores}))
    dp.shutdown(ctx)


def scaled_step(ctx, model, batch, adv) -> dict | None:
    """The step-size seam under data parallel: VCPO's ESS rule times lr / sqrt(S) at lag 4, with three
    microbatches (rank 1 holds one real and one padding). Each rank steps its own shards with the lr it computed from
    the gathered tokens, so the full weights equal one device's only if every rank used the same scale."""
    kw = {"lr": 1e-2, "microbatch_tokens": 60, "lr_lag_scaling": "inverse_sqrt"}
    obj = resolve_objective("vcpo", baseline="group_mean")
    trainer = sharded_trainer(ctx, model, obj, kw)
    trainer.version = 4
    got = trainer.step(batch, adv)
    gather_weights(trainer)
    if not ctx.leader:
        return None
    one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
    one.version = 4
    want = one.step(batch, adv)
    full, ref = trainer.export.weights(), cpu_copy(one.model)
    return {"metrics": [got, want], "max_weight_diff": max(float((full[k] - ref[k]).abs().max()) for k in ref),
            "moved": max(float((ref[k] - v).abs().max()) for k, v in cpu_copy(model).items()),
            "lr_after": trainer.opt.param_groups[0]["lr"]}  # fmt: skip


def opob_scores(ctx, tok, batch) -> dict | None:
    """VCPO's off-policy optimal baseline under data parallel, on the dense and the MoE policy: each rank takes the
    score norms of its own microbatches (3 here: rank 1 also runs a zero-weight padding copy), the rows are summed
    across ranks, and log w, ||grad log pi||^2 and the advantages equal one device's bit for bit."""
    out = {}
    for kind in ("dense", "moe"):
        model = build_tiny_model(kind, vocab_size=len(tok), seed=0, num_hidden_layers=2)
        kw, obj = {"lr": 1e-2, "microbatch_tokens": 60}, resolve_objective("vcpo")
        trainer = sharded_trainer(ctx, model, obj, kw)
        (log_w, score_sq), (adv, stats) = trainer.advantages.sequence_scores(batch), trainer.advantages(batch)
        one = Trainer(copy.deepcopy(model), obj, TrainerSettings(**kw))
        (log_w1, score_sq1), (adv1, stats1) = one.advantages.sequence_scores(batch), one.advantages(batch)
        out[kind] = {"microbatches": len(plan_microbatches(batch, 60)), "stats": [stats, stats1],
                     "equal": [torch.equal(a, b) for a, b in ((log_w, log_w1), (score_sq, score_sq1), (adv, adv1))],
                     "shift": stats1["obj/opob_shift"]}  # fmt: skip
        # the optimal token baseline's per-token pi_old and sum pi^2 (train.advantage=otb): the same way
        kw, obj = {**kw, "advantage": "otb"}, resolve_objective("grpo")
        otb = sharded_trainer(ctx, model, obj, kw).advantages(batch)[0]
        otb1 = one_device(model, obj, kw).advantages(batch)[0]
        out[kind]["otb"] = [torch.equal(otb, otb1), float((otb - otb1).abs().max()), bool(otb1.abs().max() > 0)]
    return out if ctx.leader else None


def mismatched_architecture(ctx, model) -> str:
    """Rank 1 passes a meta copy made with `Module.to("meta")`, which unties the LM head: every rank must refuse
    it when the trainer is built, instead of hanging in a collective. Returns the error (or "" if none)."""
    mine = copy.deepcopy(model) if ctx.leader else copy.deepcopy(model).to("meta")
    try:
        Trainer(mine, resolve_objective("sat_grpo"), replace(TrainerSettings(lr=1e-2), device=ctx.device),
                Sharded(ctx, template=lambda: None))  # fmt: skip
    except ValueError as e:
        return str(e)
    return ""


if __name__ == "__main__":
    main(sys.argv[1])
