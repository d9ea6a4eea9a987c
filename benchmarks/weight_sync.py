"""Weight sync: the time per version and the host memory it takes to get the trainer's weights into an engine.

Usage: ``python -m benchmarks.weight_sync [--quick] [--versions 3]`` (``--quick``: a tiny shape, nothing written).

Method. A randomly initialised Qwen3-0.6B-shaped model (local config, no hub; tied embeddings) stands for the
trainer's policy and a second one for the engine's. Two paths, each timed over ``--versions`` versions (median):

- **bytes (the `inproc` path)**: the trainer's fp32 CPU copy of the state dict (`WeightExport.weights`), pickled,
  unpickled and loaded by the engine (`load_state_dict`). Timed in one process, so the pipe between trainer and
  engine process is not counted (the real cost is higher). Until 2026-12-02 every rollout request carried such a
  copy (up to lag + 1 pickles per version under the broadcast schedule, one copy per queued request); since then
  the local backend pickles each version once.
- **dist** (`weights.transport=dist`, the local backend's real path): per version, the copy the snapshot store
  keeps, then `ProcessBackend.push` (bf16 buckets of 256 MiB over the trainer's own two-process gloo group) to an
  engine process that receives on its inbox thread and loads it. With `diagnostics.decompose` off the store keeps
  the trainer's bucket stream in bf16 (`WeightExport.buckets`, each parameter cast straight into its bucket) as
  a `Snapshot`, and the push sends those very buckets (since 2026-12-03 without a copy; now without the unpack and
  re-cut either); with it on (row
  "split on") the trainer's fp32 copy, as inproc does, cast into bf16 buckets one at a time. Timed from the start
  of the copy to the engine's "loaded" message. `weights.transport=vllm` uses the same trainer side and wire (its
  receiving end is inside vLLM's workers), so this row stands for it too; vLLM is not in this environment.

Peak host memory: the largest resident-set growth of the trainer's process over its size before the transfer
(the kernel's high-water mark, VmHWM, reset before each version; a 2 ms sampler where the kernel refuses the
reset), in GiB, next to the size of one bf16 copy of the weights (each distinct tensor once: the tied head is
one tensor). The process first sets glibc's mmap threshold to 64 KiB (``mallopt``, as ``MALLOC_MMAP_THRESHOLD_=65536``
in benchmarks.objectives), so that every large tensor is its own mapping, returned to the OS when freed: otherwise
one version's freed pages stay resident and the next version's growth reads low. Until 2026-12-03 the random policy behind this benchmark had its head untied by accident, which
added a second vocab x hidden matrix to the weights, and the unit of the last column was that untied size.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pickle
import statistics
import threading
import time

import torch

from benchmarks.memory import QUICK_SHAPES, SHAPES, VOCAB, random_qwen3
from benchmarks.objectives import M_MMAP_THRESHOLD

GiB = 2**30


class PeakRss:
    """This process's largest resident-set growth in bytes while active (``.peak``).

    Linux keeps the exact high-water mark (VmHWM) and lets a process reset it through
    /proc/self/clear_refs; a sampling thread is the fallback where that reset is refused,
    and can miss a short-lived peak between two samples.
    """

    def __enter__(self) -> PeakRss:
        self.exact = _reset_hwm()
        self.base = self.peak_abs = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak_abs = max(self.peak_abs, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_abs = max(self.peak_abs, _rss(), _hwm() if self.exact else 0)

    @property
    def peak(self) -> int:
        return self.peak_abs - self.base


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5 = reset the peak RSS to the current RSS
    except OSError:
        return False
    return _hwm() > 0


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def bytes_path(shape: dict, vocab: int, versions: int) -> dict:
    """The bytes path in one process: CPU copy, pickle, unpickle, load."""
    from satrl.training.placement import cpu_copy

    trainer, engine = random_qwen3(shape, shape["num_hidden_layers"], vocab), random_qwen3(shape, shape["num_hidden_layers"], vocab)
    pack, load, peaks = [], [], []
    for v in range(versions):
        with PeakRss() as mem:
            t0 = time.perf_counter()
            blob = pickle.dumps({v: cpu_copy(trainer)})
            t1 = time.perf_counter()
            got = pickle.loads(blob)  # noqa: S301 - the benchmark measures the path the dist transport replaces
            engine.load_state_dict(got[v])
            t2 = time.perf_counter()
            del blob, got
        pack.append(t1 - t0)
        load.append(t2 - t1)
        peaks.append(mem.peak)
    state = trainer.state_dict()
    distinct = {t.untyped_storage().data_ptr(): t for t in state.values()}.values()  # a tied head once
    return {"pack_s": statistics.median(pack), "load_s": statistics.median(load), "peak": max(peaks),
            "bytes": sum(t.numel() * t.element_size() for t in state.values()),
            "distinct": sum(t.numel() * t.element_size() for t in distinct)}  # fmt: skip


def _engine(link, shape: dict, vocab: int, versions: int, loaded) -> None:
    """The engine process of the local backend's ``dist`` transport: joins the trainer's group, receives each
    version on its inbox thread and loads it; says so on ``loaded``."""
    from satrl.weights.link import Inbox

    torch.set_num_threads(1)
    model = random_qwen3(shape, shape["num_hidden_layers"], vocab)
    inbox = Inbox(link)
    for v in range(versions):
        state = inbox.take(v)
        model.load_state_dict(state)
        del state
        loaded.put(v)


def dist_path(shape: dict, vocab: int, versions: int, keep: str = "bf16", device: str = "cpu") -> dict:
    """The real ``dist`` path of the local backend, per version: what the snapshot store keeps (``keep="bf16"``:
    the trainer's bucket stream in bf16 as it came, ``WeightExport.buckets``, when the split is off;
    ``"fp32"``: ``WeightExport.weights``' fp32 copy, when it is on), then ``ProcessBackend.push`` (bf16 buckets over
    a standalone gloo group) to an engine process that loads it. Timed to the engine's "loaded". ``device``: where
    the trainer's weights live (cuda: each bucket is copied off the GPU on the way, as a GPU trainer's are)."""
    return dist_paths(shape, vocab, versions, (keep,), device)[keep]


def dist_paths(shape: dict, vocab: int, versions: int, keeps: tuple[str, ...], device: str = "cpu") -> dict:
    """``dist_path`` for each of ``keeps`` in turn, ``versions`` timed versions each, to one engine process: the
    process's start-up (and its first version, which waits for it to join) is paid once, not once per keep."""
    from satrl.training.placement import cpu_copy
    from satrl.types import ENGINE_TIMEOUT_S
    from satrl.weights.buckets import DEFAULT_BUCKET_BYTES, aliases, buckets
    from satrl.weights.link import TrainerLink, send
    from satrl.weights.snapshot import Snapshot

    ctx = torch.multiprocessing.get_context("spawn")
    loaded = ctx.Queue()
    trainer = random_qwen3(shape, shape["num_hidden_layers"], vocab).to(device)
    trainer_link = TrainerLink(ENGINE_TIMEOUT_S, ENGINE_TIMEOUT_S)  # no queue here: no markers to order
    link = trainer_link.open(lambda: proc.is_alive())  # where the engine process joins
    proc = ctx.Process(target=_engine, args=(link, shape, vocab, 1 + versions * len(keeps), loaded))
    proc.start()
    plan = [keeps[0], *[k for k in keeps for _ in range(versions)]]  # version 0 waits for the join: not counted
    times, peaks = [], []
    for v, keep in enumerate(plan):
        with PeakRss() as mem:
            t0 = time.perf_counter()
            kept = (Snapshot.of_state(cpu_copy(trainer)) if keep == "fp32" else Snapshot.of_buckets(
                buckets(trainer, torch.bfloat16), aliases(trainer), torch.bfloat16, DEFAULT_BUCKET_BYTES))
            send(v, *kept.stream(torch.bfloat16, DEFAULT_BUCKET_BYTES), group=trainer_link.connected())
            assert loaded.get(timeout=1800) == v
            times.append(time.perf_counter() - t0)
            del kept
        peaks.append(mem.peak)
    proc.join(timeout=60)
    if proc.exitcode:
        raise RuntimeError(f"engine process exited with {proc.exitcode}")
    out = {}
    for i, keep in enumerate(keeps):
        part = slice(1 + i * versions, 1 + (i + 1) * versions)
        out[keep] = {"sync_s": statistics.median(times[part]), "peak": max(peaks[part])}
    return out


def report(name: str, today: dict, new: dict, versions: int, split_on: dict | None = None) -> str:
    bf16 = today["distinct"] / 2 / GiB  # one bf16 copy of the weights: the target's unit
    per_version = today["pack_s"] + today["load_s"]
    rows = [
        "| path | per version, s | pack / send, s | load, s | peak host growth, GiB | x one bf16 copy |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| bytes (inproc: pickled fp32 state dict) | {per_version:.2f} | {today['pack_s']:.2f} | {today['load_s']:.2f} | "
        f"{today['peak'] / GiB:.2f} | {today['peak'] / GiB / bf16:.1f} |",
        f"| dist (gloo, bf16 buckets) | {new['sync_s']:.2f} | — | — | {new['peak'] / GiB:.2f} | "
        f"{new['peak'] / GiB / bf16:.1f} |",
    ]
    if split_on is not None:
        rows.append(f"| dist, split on (store keeps fp32, bf16 buckets) | {split_on['sync_s']:.2f} | — | — | "
                    f"{split_on['peak'] / GiB:.2f} | {split_on['peak'] / GiB / bf16:.1f} |")  # fmt: skip
    return (f"{name}: fp32 state dict {today['bytes'] / GiB:.2f} GiB as the bytes path pickles it (the tied head "
            f"twice: the trainer's copy clones each key), one bf16 copy of the weights {bf16:.2f} GiB (the tied head "
            f"once); median of {versions} versions.\n\n" + "\n".join(rows) + "\n\n"
            f"Speed-up per version: {per_version / new['sync_s']:.1f}x (the bytes path once per version; before "
            "2026-12-02 it ran once per request, up to n + 1 times per version at lag n).")  # fmt: skip


def own_mmaps() -> bool:
    """Every allocation over 64 KiB its own mapping, returned to the OS when freed (see the docstring); False
    where the C library is not glibc (then nothing changes)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 << 10))
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny shape, nothing written to docs")
    ap.add_argument("--versions", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    own_mmaps()
    name, shape, vocab = ("tiny", QUICK_SHAPES["tiny"], 1000) if args.quick else ("Qwen3-0.6B", SHAPES["0.6B"], VOCAB)
    today = bytes_path(shape, vocab, args.versions)
    dist = dist_paths(shape, vocab, args.versions, ("bf16", "fp32"))  # one engine process for both
    new, split_on = dist["bf16"], dist["fp32"]
    body = report(name, today, new, args.versions, split_on)
    print(body)
    if not args.quick:
        from benchmarks._report import write_section

        doc = __doc__.split("\n\n", 2)[2].strip()
        write_section("Weight sync", f"python -m benchmarks.weight_sync --versions {args.versions}", doc + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
