"""The refactor's golden runs (issue 36): tiny trainings whose every logged number and final weight must stay
bit-identical while the code around them is redesigned.

    python -m benchmarks.golden record DIR     # run the four paths, keep their digests in DIR/golden.json
    python -m benchmarks.golden check DIR      # run them again; exit 1 naming each path that changed

    python -m benchmarks.golden check DIR --only sequential,vcpo   # some paths only

Paths: ``sequential`` (engine and trainer in one process), ``local-inproc`` and ``local-dist`` (the engine in
its own process, weights pickled onto its queue or broadcast over gloo, in-flight updates on), ``dp2``
(``torchrun --nproc_per_node=2``, FSDP2 over gloo) and ``vcpo`` (sequential, VCPO: its batched per-response
score norms, baseline and ESS step size). Each digest covers the metrics and evaluations without
timings (``wall_s``, ``perf/``) and every tensor of the safetensors files the run wrote. Bit-identity holds on
one machine and CPU kind (vector units change the last bits), so record and check on the same one; this is a
tool for a refactor's before and after, not a test of CI machines. Minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks._tiny import TINY, env, read_stable

RUN = ["steps=4", "lag.n=2", "seed=5", "eval.every=2", "objective.name=sat_grpo"]
PATHS: dict[str, list[str]] = {
    "sequential": [],
    "local-inproc": ["backend=local", "weights.transport=inproc", "lag.inflight_every=2"],
    "local-dist": ["backend=local", "weights.transport=dist", "lag.inflight_every=2"],
    "dp2": [],
    "vcpo": ["objective.name=vcpo"],  # VCPO's batched score norms (issue 45) and its ESS step size
}
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _train(name: str, out: Path) -> None:
    args = ["-m", "satrl", "train", *TINY, *RUN, *PATHS[name], f"out={out}", "--no-progress"]
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", *args] if name == "dp2" else [sys.executable, *args]
    done = subprocess.run(cmd, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"golden: {name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def digest(out: Path) -> dict[str, str]:
    """SHA-256 of the run's stable metrics, its evaluations and each folder's safetensors tensors (by relative
    path). Tensors, not file bytes: a data-parallel checkpoint's shard files order their metadata differently
    from one run to the next, and which rank writes the optimizer's step counters varies, so one folder's
    shards are read as one set of (name, offsets) -> bytes."""
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    rows = {f: sha(json.dumps(read_stable(out / f), sort_keys=True).encode()) for f in ("metrics.jsonl", "eval.jsonl")}
    folders = sorted({p.parent for p in out.rglob("*.safetensors")})
    return {**rows, **{str(d.relative_to(out)): _tensors_digest(sorted(d.glob("*.safetensors"))) for d in folders}}


def _tensors_digest(files: list[Path]) -> str:
    from safetensors import safe_open

    entries = {}
    for f in files:
        with safe_open(f, "pt") as handle:
            offsets = json.loads((handle.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            for name in handle.keys():
                t = handle.get_tensor(name)
                data = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                key = f"{name}@{offsets.get(name, {}).get('saved_offsets', [])}"
                entries[key] = f"{t.dtype}{tuple(t.shape)}:{hashlib.sha256(data).hexdigest()}"
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def run_all(work: Path, names: list[str]) -> dict[str, dict[str, str]]:
    got = {}
    for name in names:
        print(f"golden: {name} ...", file=sys.stderr, flush=True)
        _train(name, work / name)
        got[name] = digest(work / name)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.golden", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("record", "check"))
    ap.add_argument("dir", type=Path, help="where golden.json is kept")
    ap.add_argument("--only", default=",".join(PATHS), help="comma-separated paths (default: all)")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    if unknown := [n for n in names if n not in PATHS]:
        ap.error(f"--only: unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
    with tempfile.TemporaryDirectory() as tmp:
        got = run_all(Path(tmp), names)
    if a.mode == "record":
        a.dir.mkdir(parents=True, exist_ok=True)
        (a.dir / "golden.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"golden: recorded {len(got)} paths in {a.dir / 'golden.json'}")
        return 0
    want = json.loads((a.dir / "golden.json").read_text())
    changed = [n for n in names if got[n] != want.get(n)]
    for n in changed:
        diff = sorted(k for k in set(got[n]) | set(want.get(n, {})) if got[n].get(k) != want.get(n, {}).get(k))
        print(f"golden: {n} changed: {', '.join(diff)}")
    print(f"golden: {len(names) - len(changed)} of {len(names)} paths bit-identical")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
