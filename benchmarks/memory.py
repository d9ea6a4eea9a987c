"""Trainer memory: fixed bytes and peak bytes per microbatch token, before and after the GPU settings, and the
projected peak per rank for Qwen3-0.6B / 1.7B / 8B shapes at 16k tokens per microbatch.

    python -m benchmarks.memory            # measures on CPU (about 2 minutes), writes the "Memory" section
    python -m benchmarks.memory --quick    # tiny shapes, nothing written (a smoke run of the logic)

Settings. *before*: fp32, no activation checkpointing, full-vocabulary log-softmax (``logprob_chunk_tokens=0``),
a reference model and a scratch copy in fp32. *after*: ``dtype=bf16`` (autocast, fp32 master weights and AdamW),
``activation_checkpointing=true``, ``logprob_chunk_tokens=2048``, the reference in bf16, no scratch copy.

Method. Models are randomly initialised from local ``Qwen3Config`` shapes (no hub). *Fixed bytes* are the
parameter count (built on the meta device) times the bytes each setting keeps per parameter: weights 4, AdamW
8, reference 4 or 2, scratch copy 4 or 0 (the old code's fp32 copy, counted by formula since it no longer
exists); the check row counts the tensors of a real 1-layer trainer after a step (the formula plus AdamW's
4-byte step counters). *Activations* are measured: the bytes the policy forward of ``Trainer.step`` saves
for the backward (a ``saved_tensors_hooks`` pack hook; distinct storages, parameters excluded), at 256 and 512
tokens of one row (prompt 16); the slope is the bytes per token. A full-depth model does not fit this machine's
RAM and time, so the per-layer slope is the difference between a 1- and a 2-layer model of each shape with a
1024-token vocabulary, and the head's slope (final norm, LM head, log-softmax) comes from a 1-layer 0.6B-shaped
model with the real 151936-token vocabulary, used for all three shapes (they share that vocabulary).
*Projected peak* = fixed + gradients (4 bytes per parameter) + the embedding's dense gradient (vocab x hidden x
4) + tokens x (head + layers x per layer) + the backward's working set, which is counted, not measured: before,
three fp32 [tokens, vocab] gradients of the log-softmax path; after, three fp32 [chunk, vocab] gradients and
one decoder layer's recomputed activations (its *before* per-layer bytes). It is an upper bound: it holds every
gradient and every saved activation at once. The optimizer step's peak (fixed + gradients + the fp32 sqrt(v)
temporary of torch's foreach AdamW, 4 bytes per parameter) is counted too, and the peak is the larger of the two. The 8-rank rows divide fixed bytes and gradients by 8 (FSDP2
sharding) and keep activations whole; they are a projection (FSDP2 is built, satrl.training.dp, but was not run at
these shapes on 8 ranks), and so is every
full-depth number (measured pieces, added up). The GPU check (benchmarks/gpu_check.py) measures the real peak.
"""

from __future__ import annotations

import argparse
import time

import torch

GiB = 2**30
VOCAB = 151936
# Qwen3 shapes (Hugging Face configs of Qwen/Qwen3-0.6B, -1.7B, -8B).
SHAPES = {
    "0.6B": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    "1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, intermediate_size=6144, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=12288, tie_word_embeddings=False),
}  # fmt: skip
QUICK_SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, tie_word_embeddings=True),
}  # fmt: skip
SETTINGS = {
    "before": dict(dtype="fp32", activation_checkpointing=False, logprob_chunk_tokens=0),
    "after": dict(dtype="bf16", activation_checkpointing=True, logprob_chunk_tokens=2048),
}
FIXED_BYTES_PER_PARAM = {"before": 4 + 8 + 4 + 4, "after": 4 + 8 + 2 + 0}  # weights, AdamW, reference, scratch
TARGET_TOKENS = 16384
RANKS = (1, 6, 8)
CARD_GB = 80
# (layout, trainer ranks, vLLM memory fraction on rank 0's GPU, vLLM fraction on an engine GPU of its own)
LAYOUTS = (
    ("both vLLMs on rank 0's GPU (0.3 each)", 8, 0.6, 0.0),
    ("rollout vLLM on GPU 7 (0.85), eval vLLM on rank 0's GPU (0.2)", 7, 0.2, 0.85),
)


def qwen3_config(shape: dict, layers: int, vocab: int):
    from transformers import Qwen3Config

    cfg = Qwen3Config(**{**shape, "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 32768})
    cfg._attn_implementation = "sdpa"
    return cfg


def meta_qwen3(shape: dict, layers: int, vocab: int) -> torch.nn.Module:
    """The Qwen3-shaped causal LM on the meta device: no bytes, tied embeddings tied."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        return Qwen3ForCausalLM(qwen3_config(shape, layers, vocab))


def param_count(shape: dict, layers: int | None = None, vocab: int = VOCAB) -> int:
    """Distinct parameters of the shape (tied embeddings once), counted on the meta device."""
    return sum(p.numel() for p in meta_qwen3(shape, layers or shape["num_hidden_layers"], vocab).parameters())


def one_row_batch(n_tokens: int, vocab: int, prompt: int = 16):
    from satrl.pipeline.buffer import collate
    from satrl.types import Sample

    g = torch.Generator().manual_seed(n_tokens)
    ids = torch.randint(0, vocab, (n_tokens,), generator=g).tolist()
    resp = ids[prompt:]
    return collate([Sample("s", "g", ids[:prompt], resp, -torch.rand(len(resp), generator=g), 0, 1.0)], 0)


def random_qwen3(shape: dict, layers: int, vocab: int) -> torch.nn.Module:
    """A Qwen3-shaped causal LM with small random weights, built without transformers' (slow) init."""
    torch.manual_seed(0)
    model = meta_qwen3(shape, layers, vocab).to_empty(device="cpu")
    model.tie_weights()  # to_empty gives each module its own tensor: tie the LM head back (tied shapes)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    model.model.rotary_emb.__init__(model.config)  # its inv_freq buffer was left empty on the meta device
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == bool(shape["tie_word_embeddings"])
    return model


def build_trainer(shape: dict, layers: int, vocab: int, setting: str, objective=None, **kw):
    """A trainer of a random Qwen3-shaped policy in one of SETTINGS; by default grpo with a KL term (so that it
    holds a reference model)."""
    from satrl.objectives import resolve_objective
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    objective = objective or resolve_objective("grpo", kl_coef=1e-3)
    options = {"lr": 1e-6, "microbatch_tokens": 1 << 30, **SETTINGS[setting], **kw}
    return Trainer(random_qwen3(shape, layers, vocab), objective, TrainerSettings(**options))


def saved_bytes(trainer, n_tokens: int, vocab: int) -> int:
    """Bytes the policy forward saves for the backward (activations: distinct storages, parameters excluded;
    autocast's bf16 weight copies are N-independent and drop out of the per-token slope)."""
    from satrl.training.microbatches import plan_microbatches

    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        ptr = x.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = x.untyped_storage().nbytes()
        return x

    batch = one_row_batch(n_tokens, vocab)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logp, _ = trainer.scorer.logp(trainer.model, batch, plan_microbatches(batch, 1 << 30)[0])
    del logp
    return sum(seen.values())


def per_token(trainer, vocab: int, tokens: list[int]) -> float:
    (n1, n2) = tokens
    return (saved_bytes(trainer, n2, vocab) - saved_bytes(trainer, n1, vocab)) / (n2 - n1)


def fixed_measured(trainer) -> int:
    """Bytes the resting trainer holds: policy weights, AdamW state, reference weights (distinct storages)."""
    seen, total = set(), 0
    tensors = [*trainer.model.parameters(), *(t for st in trainer.opt.state.values() for t in st.values())]
    if trainer.ref_model is not None:
        tensors += list(trainer.ref_model.parameters())
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def measure_all(shapes: dict, head: str, vocab: int, tokens: list[int]) -> dict:
    """Per setting: the fixed-bytes check, the head's and each shape's per-layer saved bytes per token."""
    res = {}
    for setting in SETTINGS:
        tr = build_trainer(shapes[head], 1, vocab, setting)
        tr.step(one_row_batch(32, vocab), torch.ones(1))  # AdamW allocates its state at the first step
        params = sum(p.numel() for p in tr.model.parameters())
        check = {"measured": fixed_measured(tr), "formula": params * (FIXED_BYTES_PER_PARAM[setting] - SCRATCH[setting])}
        head_1 = per_token(tr, vocab, tokens)
        del tr
        layer = {}
        for name, shape in shapes.items():
            one, two = (per_token(build_trainer(shape, n, 1024, setting), 1024, tokens) for n in (1, 2))
            layer[name] = two - one
        res[setting] = {"check": check, "head": head_1 - layer[head], "layer": layer}
    return res


SCRATCH = {"before": 4, "after": 0}  # the old code's persistent fp32 scratch copy (no longer exists to measure)


def fsdp_buffers(shape: dict, vocab: int, setting: str) -> dict:
    """FSDP2's working buffers per rank (bytes), counted from the sharding satrl.training.dp applies: one unit
    per decoder layer and the root (embedding, final norm, LM head). Parameters are all-gathered in the param
    dtype (bf16 under ``MixedPrecisionPolicy`` on CUDA in *after*, fp32 in *before*): two layers at once (the one
    running and the one prefetched), and the root for the whole step (FSDP2 keeps the root unsharded between
    forward and backward). Gradients reach the reduce-scatter unsharded, in the param dtype plus an fp32 copy
    for ``reduce_dtype``: two layers at once (one reducing while the next is computed) and the root's at the
    end of the backward. Counted, not measured (no multi-GPU machine here)."""
    layer_params = param_count(shape, layers=2, vocab=vocab) - param_count(shape, layers=1, vocab=vocab)
    root_params = param_count(shape, layers=1, vocab=vocab) - layer_params
    b = 2 if setting == "after" else 4
    grad_b = b + (4 if b != 4 else 0)
    gather = 2 * layer_params * b + root_params * b
    reduce = 2 * layer_params * grad_b + root_params * grad_b
    return {"gather": gather, "reduce": reduce, "total": gather + reduce}


def project(res: dict, shapes: dict, vocab: int, tokens: int, ranks: int, setting: str, name: str) -> dict:
    """Projected peak bytes per rank (an upper bound: every gradient and every saved activation at once). On
    more than one rank FSDP2's working buffers (:func:`fsdp_buffers`) replace the one-device embedding
    gradient (the root's unsharded gradients are among them)."""
    shape = shapes[name]
    P, L, H = param_count(shape, vocab=vocab), shape["num_hidden_layers"], shape["hidden_size"]
    r = res[setting]
    fixed, grads = P * FIXED_BYTES_PER_PARAM[setting], 4 * P
    # the embedding's dense gradient, before it is added into the weight's; under FSDP2, its working buffers
    emb_grad = vocab * H * 4 if ranks == 1 else fsdp_buffers(shape, vocab, setting)["total"]
    saved = tokens * (r["head"] + L * r["layer"][name])
    if setting == "before":  # the full-vocabulary backward: ~3 fp32 [N, V] gradients besides the saved output
        work = tokens * 3 * vocab * 4
    else:  # one chunk's [chunk, V] gradients, and the one decoder layer being recomputed (its fp32 activations)
        work = 3 * SETTINGS["after"]["logprob_chunk_tokens"] * vocab * 4 + tokens * res["before"]["layer"][name]
    train = (fixed + grads) / ranks + emb_grad + saved + work
    opt = (fixed + grads + 4 * P) / ranks  # the optimizer step: foreach AdamW's fp32 sqrt(v) temporary
    return {"params": P, "fixed": fixed / ranks, "grads": grads / ranks, "act": emb_grad + saved + work,
            "train": train, "opt": opt, "peak": max(train, opt)}  # fmt: skip


def report(res: dict, shapes: dict, vocab: int, tokens: int, head: str, wall: float) -> str:
    g = lambda b: f"{b / GiB:.1f}"  # noqa: E731
    lines = ["Fixed bytes per parameter (weights 4, AdamW 8, reference, scratch copy) and the check on the "
             f"1-layer {head}-shaped trainer (weights, AdamW state and reference counted from its tensors):", "",
             "| setting | bytes / param | measured (1 layer) | formula without scratch |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for s in SETTINGS:
        c = res[s]["check"]
        lines.append(f"| {s} | {FIXED_BYTES_PER_PARAM[s]} | {c['measured']:,} | {c['formula']:,} |")
    lines += ["", "Saved activation bytes per microbatch token (slope between the two token counts):", "",
              "| shape | before: per layer | before: head | after: per layer | after: head |",
              "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name in shapes:
        b, a = res["before"], res["after"]
        lines.append(f"| {name} | {b['layer'][name]:,.0f} | {b['head']:,.0f} | {a['layer'][name]:,.0f} | {a['head']:,.0f} |")
    lines += ["", f"Projected peak per rank at {tokens:,} tokens per microbatch (GiB; R ranks = FSDP2 sharding of "
              "weights, gradients, AdamW and reference by R, activations whole, plus FSDP2's working buffers: "
              "all-gathered layers and root, unsharded gradients before their reduce-scatter; a projection, not a "
              "multi-GPU run):",
              "", "| shape | params | setting | ranks | fixed | gradients | activations + working set "
              "| forward + backward | optimizer step | peak |",
              "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name in shapes:
        for s in SETTINGS:
            for ranks in RANKS:
                p = project(res, shapes, vocab, tokens, ranks, s, name)
                lines.append(f"| {name} | {p['params'] / 1e9:.2f}B | {s} | {ranks} | {g(p['fixed'])} | {g(p['grads'])} "
                             f"| {g(p['act'])} | {g(p['train'])} | {g(p['opt'])} | {g(p['peak'])} |")  # fmt: skip
    first, last = next(iter(shapes)), list(shapes)[-1]
    lines += ["", *layouts(res, shapes, vocab, tokens, last)]
    target = project(res, shapes, vocab, tokens, 1, "after", first)["peak"] / GiB
    lines += ["", f"Target {first} at {tokens:,} tokens on one device <= 40 GiB: {target:.1f} GiB, "
              f"{'met' if target <= 40 else 'NOT met'}. Measured in {wall:.0f} s."]  # fmt: skip
    return "\n".join(lines)


def layouts(res: dict, shapes: dict, vocab: int, tokens: int, name: str) -> list[str]:
    """Where the engines go on one 8 x 80 GB node, per rank, for ``name`` in *after*: rank 0 carries what
    shares its GPU (vLLM reserves ``gpu_memory_utilization`` x the card), the other trainer ranks the trainer
    alone, an engine GPU vLLM alone."""
    g = lambda b: f"{b / GiB:.1f}"  # noqa: E731
    buf = fsdp_buffers(shapes[name], vocab, "after")
    out = [f"Where the engines go for {name} on one node of 8 x {CARD_GB} GB (*after*; vLLM reserves its "
           f"gpu_memory_utilization x {CARD_GB} GB; FSDP2 buffers of the trainer: {g(buf['gather'])} GiB all-gathered, "
           f"{g(buf['reduce'])} GiB of unsharded gradients):", "",
           "| layout | trainer ranks | trainer peak / rank | rank 0 GPU | other trainer GPUs | engine GPU | fits |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for label, ranks, on_rank0, own in LAYOUTS:
        peak = project(res, shapes, vocab, tokens, ranks, "after", name)["peak"]
        rank0 = peak + on_rank0 * CARD_GB * 1e9
        engine = own * CARD_GB * 1e9
        fits = max(rank0, peak, engine) <= CARD_GB * 1e9
        out.append(f"| {label} | {ranks} | {g(peak)} | {g(rank0)} | {g(peak)} | {g(engine) if own else '—'} "
                   f"| {'yes' if fits else 'no'} |")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, nothing written to docs")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes, vocab, tokens = (QUICK_SHAPES, 1000, [32, 64]) if args.quick else (SHAPES, VOCAB, [256, 512])
    head = next(iter(shapes))
    t0 = time.perf_counter()
    res = measure_all(shapes, head, vocab, tokens)
    body = report(res, shapes, vocab, TARGET_TOKENS, head, time.perf_counter() - t0)
    print(body)
    if not args.quick:
        from benchmarks._report import write_section

        write_section("Memory", f"python -m benchmarks.memory --threads {args.threads}", __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
