"""Data parallel training with FSDP2, launched by ``torchrun --nproc_per_node=N -m satrl train ...``: this
process's place in the job (:class:`DataParallel`), the process groups, what rank 0 broadcasts to the others
(:func:`broadcast_ints`, :func:`broadcast_tensors`), the ranks' :class:`Watchdog`, FSDP2's sharding. Which ranks do
what for a run config is :mod:`satrl.launch.data_parallel`.

Design (docs/design.md, "Data parallel"): every rank runs the same training loop
(:func:`satrl.loop.orchestrator.train`, given the :class:`DataParallel` that :func:`init` returns; no module
keeps it) on a plain :class:`~satrl.training.trainer.Trainer` over the :class:`~satrl.training.sharded.Sharded`
placement (SPMD). Rank 0 alone does the loop's I/O: the rollout backend and its engine, the run directory, the
evaluator, the snapshot store (stand-ins elsewhere). It broadcasts each collated batch and, at each sync point,
whether every rank gathers the weights now (:mod:`satrl.launch.data_parallel`).

The process group is gloo on CPU and NCCL on CUDA; rank 0's broadcasts go over a gloo group on CPU (``control``)
with a long timeout, because the other ranks wait there while rank 0 generates and evaluates. So that a stopped or
frozen rank does not hang the job for that long, every rank beats a heartbeat into torchrun's store and watches
the others' (:class:`Watchdog`): one that misses ``train.rank_timeout_s`` is named in one line and the job ends.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from satrl.dtypes import WIRE

CONTROL_TIMEOUT = datetime.timedelta(days=7)  # the others wait on rank 0's loop: generation, evaluation, I/O


@dataclass
class DataParallel:
    """This process's place in the job: rank, world size, device, groups and the FSDP mesh."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    group: object  # the data plane (FSDP's collectives, the step's reductions)
    control: object  # gloo, long timeout: rank 0's broadcasts, which the others may wait on for a generation
    mesh: object
    watchdog: Watchdog | None = None

    @property
    def leader(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process: its environment protocol."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def launcher_gone(launcher: int) -> bool:
    """Whether this process's parent is no longer ``launcher`` (its pid at start): the parent died and this
    process was re-parented (to init or a subreaper)."""
    return os.getppid() != launcher


def resume_hint(run_dir: str | os.PathLike | None) -> str:
    """How a data-parallel run a rank ended goes on: its own folder named (the heartbeat printed a literal
    ``RUN_DIR``, issue 60), or, where the caller has none, its ``out=``."""
    where = run_dir if run_dir is not None else "<its out= folder>"
    return f"its checkpoints are intact: continue with satrl train --resume {where} under torchrun"


def watch_launcher(launcher: int, stop: threading.Event, period_s: float = 1.0,
                   run_dir: str | os.PathLike | None = None) -> None:  # fmt: skip
    """Each ``period_s`` until ``stop``: when the torchrun launcher (the elastic agent, this rank's parent,
    ``launcher``) is gone, say so on stderr in one line (how to resume ``run_dir``) and exit 1. Killed alone
    (SIGKILL: no chance to end its workers), it would otherwise leave its ranks training with nobody to collect
    them."""
    while not stop.wait(period_s):
        if launcher_gone(launcher):
            rank = os.environ.get("RANK", "?")
            print(f"satrl train: data parallel: the torchrun launcher (pid {launcher}) is gone; ending this rank "
                  f"(rank {rank}, pid {os.getpid()}; {resume_hint(run_dir)})", file=sys.stderr, flush=True)  # fmt: skip
            os._exit(1)


class Watchdog:
    """Each second, bump this rank's heartbeat counter in ``store`` and check every other rank's: a rank whose
    counter has not moved for ``timeout_s`` seconds (stopped, or frozen outside Python's reach) is named on
    stderr in one line and this process exits 1, so torchrun ends the job; its checkpoints are intact. A rank
    that ends normally says so first (:meth:`stop`). Counters, not clocks: the nodes' clocks may differ.

    Under torchrun (``TORCHELASTIC_RUN_ID`` set) it also watches this rank's parent, the launcher, on a thread of
    its own (:func:`watch_launcher`: the store it beats into may be the launcher's, gone with it): when the
    launcher dies this rank ends too, within a second or so."""

    def __init__(self, store, rank: int, world: int, timeout_s: float,
                 run_dir: str | os.PathLike | None = None) -> None:  # fmt: skip
        self.store, self.rank, self.world, self.timeout_s, self.run_dir = store, rank, world, timeout_s, run_dir
        self._stop = threading.Event()
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        store.set(f"pid/{rank}", str(os.getpid()))
        threading.Thread(target=self._run, daemon=True, name="satrl-rank-watchdog").start()
        if self.launcher is not None:
            threading.Thread(target=watch_launcher, args=(self.launcher, self._stop, 1.0, run_dir), daemon=True,
                             name="satrl-launcher-watch").start()  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        try:
            self.store.set(f"beat/{self.rank}", "done")
        except Exception:  # noqa: BLE001 - the store went with the job: nobody is left to watch
            pass

    def _run(self) -> None:
        seen = {r: ("", time.monotonic()) for r in range(self.world) if r != self.rank}
        n = 0
        try:
            while not self._stop.wait(1.0 if n else 0.0):
                n += 1
                self.store.set(f"beat/{self.rank}", str(n))
                for r, (last, since) in list(seen.items()):
                    beat = self.store.get(f"beat/{r}").decode() if self.store.check([f"beat/{r}"]) else ""
                    if beat == "done":
                        del seen[r]
                    elif beat != last:
                        seen[r] = (beat, time.monotonic())
                    elif time.monotonic() - since > self.timeout_s and not self._stop.is_set():
                        self._hung(r)
        except Exception:  # noqa: BLE001 - the store is gone (the job is ending): stop watching
            return

    def _hung(self, r: int) -> None:
        pid = self.store.get(f"pid/{r}").decode() if self.store.check([f"pid/{r}"]) else "?"
        print(f"satrl train: data parallel: rank {r} (pid {pid}) gave no heartbeat for {self.timeout_s:g} s "
              f"(train.rank_timeout_s): it is stopped or frozen; ending the job ({resume_hint(self.run_dir)})",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(1)


def init(device: str, rank_timeout_s: float = 120.0, run_dir: str | os.PathLike | None = None) -> DataParallel:
    """Join the job torchrun started: the process group (NCCL on CUDA, gloo on CPU), the control group,
    the 1-D device mesh FSDP shards over, and the :class:`Watchdog` of the ranks (``rank_timeout_s``; its
    one-line exits name ``run_dir``'s resume). The caller passes what it returns to whatever needs it: no module
    keeps it."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = device.startswith("cuda")
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    mesh = init_device_mesh(dev.type, (world,))
    store = dist.PrefixStore("satrl/ranks/", dist.distributed_c10d._get_default_store())
    watchdog = Watchdog(store, rank, world, rank_timeout_s, run_dir)  # one rank too: it watches its launcher
    return DataParallel(rank, world, local, dev, dist.group.WORLD, control, mesh, watchdog=watchdog)


def shutdown(ctx: DataParallel | None) -> None:
    """Leave the job ``ctx`` (from :func:`init`): this rank's watchdog says it ended normally, the groups go."""
    if ctx is not None and ctx.watchdog is not None:
        ctx.watchdog.stop()
    if dist.is_initialized():
        dist.destroy_process_group()


# -- rank 0's broadcasts: ints and tensors over the control group, never pickles ----------------------
MAX_DIMS = 6
_META = 2 + MAX_DIMS  # per tensor: dtype code (-1: None), ndim, shape


def broadcast_ints(dp: DataParallel, values: list[int] | None, n: int) -> list[int]:
    """Rank 0's ``n`` ints ``values`` on every rank (the others pass None)."""
    t = torch.tensor(values, dtype=torch.int64) if dp.leader else torch.zeros(n, dtype=torch.int64)
    if t.numel() != n:
        raise ValueError(f"broadcast_ints: {t.numel()} values, expected {n}")
    dist.broadcast(t, src=0, group=dp.control)
    return t.tolist()


def broadcast_tensors(dp: DataParallel, tensors: list[torch.Tensor | None] | None) -> list[torch.Tensor | None]:
    """Rank 0's ``tensors`` (any of :data:`~satrl.dtypes.WIRE`'s dtypes, or None) on every rank, as CPU tensors
    (the others pass None): their count, then their dtypes and shapes, then one byte buffer of their contents."""
    if dp.leader:
        data = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in tensors if t is not None]
        meta = [v for t in tensors for v in _meta(t)]
        head = broadcast_ints(dp, [len(tensors), sum(x.numel() for x in data)], 2)
        if meta:
            broadcast_ints(dp, meta, len(meta))
        if head[1]:
            dist.broadcast(torch.cat(data), src=0, group=dp.control)
        return [None if t is None else t.detach().to("cpu") for t in tensors]
    count, size = broadcast_ints(dp, None, 2)
    meta = broadcast_ints(dp, None, count * _META) if count else []
    buf = torch.zeros(size, dtype=torch.uint8)
    if size:
        dist.broadcast(buf, src=0, group=dp.control)
    out: list[torch.Tensor | None] = []
    at = 0
    for i in range(count):
        code, ndim, *shape = meta[i * _META : (i + 1) * _META]
        if code < 0:
            out.append(None)
            continue
        dtype, shape = WIRE[code], shape[:ndim]
        n = torch.Size(shape).numel() * dtype.itemsize
        out.append(buf[at : at + n].clone().view(dtype).reshape(shape))  # a copy of its own: aligned
        at += n
    return out


def _meta(t: torch.Tensor | None) -> list[int]:
    if t is None:
        return [-1, 0] + [0] * MAX_DIMS
    if t.dim() > MAX_DIMS:
        raise ValueError(f"a tensor of {t.dim()} dims cannot be broadcast to the other ranks (at most {MAX_DIMS})")
    return [WIRE.index(t.dtype), t.dim(), *t.shape, *[0] * (MAX_DIMS - t.dim())]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (``model.model.layers``), each its own FSDP unit."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"data parallel shards a transformers causal LM's decoder layers; {type(model).__name__} has none")
    return list(layers)


def shard(model: torch.nn.Module, mesh, mixed_precision=None) -> None:
    """FSDP2 over each decoder layer, then the root (embeddings, final norm, LM head), as torchtitan's
    ``parallelize`` does. Gradients are summed across ranks, not averaged: each microbatch's loss is
    already scaled by its share of the whole minibatch's tokens, on whichever rank it runs."""
    from torch.distributed.fsdp import fully_shard

    kw = {"mesh": mesh} if mixed_precision is None else {"mesh": mesh, "mp_policy": mixed_precision}
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for module in [*layers, model]:  # a plain SUM (factor 1 with forced sum: no PREMUL_SUM, which gloo lacks)
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
