"""Data-parallel start-up: each rank's peak host memory while it builds its policy and the FSDP2 trainer.

Usage: ``python -m benchmarks.dp_init [--quick] [--ranks 2]`` (``--quick``: a tiny shape, nothing written).

Method. ``torchrun --standalone --nproc_per_node=RANKS`` on CPU (gloo), twice. Rank 0 builds a randomly
initialised Qwen3-0.6B-shaped policy (local config, no hub; tied embeddings), standing for the checkpoint it
loads. The other ranks build either the same loaded policy (row "loaded": what every rank did before
2026-12-03) or the architecture on the meta device (row "meta": what ``satrl train`` under torchrun does
since, through ``satrl.models.empty_model``). Then every rank builds its trainer over FSDP2 shards (``Trainer`` on
``Sharded``, as ``satrl.launch.setup.build_trainer`` does) with a KL term (so that it holds a reference
model) and ``dtype=bf16``: the policy's fp32 shards and the reference's bf16 shards, filled
from rank 0's weights one parameter at a time. Peak host memory is each rank's largest resident-set growth
from before the policy is built to after the trainer is (the kernel's high-water mark, VmHWM, reset first; a
2 ms sampler where the kernel refuses the reset), next to what the rank keeps (its shards) and to one fp32
copy of the whole policy.

Before 2026-12-03 every rank also built its reference as a deep copy of the fp32 policy, cast afterwards. At
that commit (26b59cc), ``PYTHONPATH=<a checkout of 26b59cc>/src python -m benchmarks.dp_init --modes loaded
--no-write`` measured 4.74 GiB of peak host growth on each of the 2 ranks (2.13 fp32 copies), for the same
1.67 GiB of shards kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.memory import QUICK_SHAPES, SHAPES, VOCAB, meta_qwen3, random_qwen3

GiB = 2**30
MODES = ("loaded", "meta")


def build_policy(shape: dict, vocab: int, leader: bool, mode: str) -> torch.nn.Module:
    """Rank 0's loaded policy, or another rank's: loaded too, or the architecture on the meta device."""
    build = random_qwen3 if leader or mode == "loaded" else meta_qwen3
    return build(shape, shape["num_hidden_layers"], vocab)


def kept_bytes(trainer) -> int:
    """The bytes of this rank's shards: policy (fp32) and reference (bf16)."""
    models = [m for m in (trainer.model, trainer.ref_model) if m is not None]
    tensors = [t.to_local() if hasattr(t, "to_local") else t for m in models for t in m.parameters()]
    return sum(t.numel() * t.element_size() for t in tensors)


def worker(mode: str, quick: bool, out: Path) -> None:
    """One rank's part (under torchrun): build the policy and the trainer, write what it measured."""
    from transformers import Qwen3ForCausalLM  # noqa: F401  (imported before measuring: not the policy's bytes)

    from benchmarks.weight_sync import PeakRss
    from satrl.objectives import resolve_objective
    from satrl.training import dp
    from satrl.training.settings import TrainerSettings
    from satrl.training.sharded import Sharded
    from satrl.training.trainer import Trainer

    torch.set_num_threads(1)
    shape, vocab = (QUICK_SHAPES["tiny"], 1000) if quick else (SHAPES["0.6B"], VOCAB)
    objective = resolve_objective("grpo", kl_coef=1e-3)
    ctx = dp.init("cpu")
    with PeakRss() as mem:
        policy = build_policy(shape, vocab, ctx.leader, mode)
        full = sum(p.numel() for p in policy.parameters()) * 4
        settings = TrainerSettings(lr=1e-6, dtype="bf16", device=str(ctx.device))
        trainer = Trainer(policy, objective, settings, Sharded(ctx, template=lambda: None))
    row = {"mode": mode, "rank": ctx.rank, "peak": mem.peak, "kept": kept_bytes(trainer), "full_fp32": full}
    (out / f"{mode}-{ctx.rank}.json").write_text(json.dumps(row))
    dp.shutdown(ctx)


def launch(mode: str, ranks: int, quick: bool, out: Path) -> list[dict]:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", f"--nproc_per_node={ranks}", "-m", "benchmarks.dp_init",
           "--worker", mode, "--out", str(out)] + (["--quick"] if quick else [])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"dp_init: {mode}, {ranks} ranks ...", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed ({done.returncode}): {done.stderr[-2000:]}")
    return [json.loads((out / f"{mode}-{r}.json").read_text()) for r in range(ranks)]


def report(name: str, ranks: int, rows: list[dict]) -> str:
    full = rows[0]["full_fp32"]
    lines = [
        f"{name}, {ranks} ranks; one fp32 copy of the policy: {full / GiB:.2f} GiB.",
        "",
        "| other ranks given | rank | peak host growth (GiB) | kept: shards (GiB) | peak / fp32 copy |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['rank']} | {r['peak'] / GiB:.2f} | {r['kept'] / GiB:.2f} | "
                     f"{r['peak'] / full:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny shape, nothing written to docs")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help="what the other ranks are given: loaded, meta or both")
    ap.add_argument("--no-write", action="store_true", help="print the table only (e.g. against an older checkout)")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.quick, args.out)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes: choose from {', '.join(MODES)}, comma-separated; got {args.modes!r}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for mode in modes for row in launch(mode, args.ranks, args.quick, Path(tmp))]
    body = report("tiny" if args.quick else "Qwen3-0.6B", args.ranks, rows)
    print(body)
    if not (args.quick or args.no_write):
        from benchmarks._report import write_section

        doc = __doc__.split("\n\n", 2)[2].strip()
        write_section("Data-parallel start-up", f"python -m benchmarks.dp_init --ranks {args.ranks}", doc + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
