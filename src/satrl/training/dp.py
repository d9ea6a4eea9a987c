"""Data parallel training with FSDP2, launched by ``torchrun --nproc_per_node=N -m satrl train ...``.

The mechanism: the process group, the control channel, FSDP2 sharding; the launch (which ranks do what
for a run config) is :mod:`satrl.pipeline.data_parallel`. Design (docs/design.md, "Data parallel"): rank 0 is the controller. It alone runs the training loop
(:func:`satrl.pipeline.orchestrator.train`): the rollout backend and its engine, the run directory, the
evaluator, the snapshot store. Its trainer is a :class:`~satrl.training.dp_trainer.DPTrainer`, whose every
call that needs the other ranks (a step, pi_old, gathering the weights, a checkpoint) first announces itself
on a control channel (:mod:`satrl.training.dist_channel`) with the data it needs, such as the minibatch.
The other ranks run :func:`serve`: build the same trainer, then wait for the next call and join it. So only
rank 0 writes files or talks to engines, and the collectives of every rank line up by construction.

The process group is gloo on CPU and NCCL on CUDA; the control channel is always a gloo group on CPU, with a
long timeout, because the other ranks wait on it while rank 0 generates and evaluates.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from satrl.training.dist_channel import Channel

# Ops on the control channel (rank 0 -> the others).
START, STEP, LOGP, GATHER, LOAD_WEIGHTS, SAVE, LOAD, STOP, BUCKETS = range(9)
CONTROL_TIMEOUT = datetime.timedelta(days=7)  # the others wait on rank 0's loop: generation, evaluation, I/O


@dataclass
class DataParallel:
    """This process's place in the job: rank, world size, device, groups, the FSDP mesh and the channel."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    group: object  # the data plane (FSDP's collectives, the step's reductions)
    channel: Channel
    mesh: object
    busy: bool = False  # inside a call the other ranks joined (see satrl.pipeline.data_parallel.run)

    @property
    def leader(self) -> bool:
        return self.rank == 0


_CURRENT: DataParallel | None = None


def current() -> DataParallel | None:
    """The data-parallel context of this process, or None on one device."""
    return _CURRENT


def launched() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process: its environment protocol."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init(device: str) -> DataParallel:
    """Join the job torchrun started: the process group (NCCL on CUDA, gloo on CPU), the control channel
    and the 1-D device mesh FSDP shards over."""
    global _CURRENT
    from torch.distributed.device_mesh import init_device_mesh

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = device.startswith("cuda")
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    mesh = init_device_mesh(dev.type, (world,))
    _CURRENT = DataParallel(rank, world, local, dev, dist.group.WORLD, Channel(control), mesh)
    return _CURRENT


def shutdown() -> None:
    global _CURRENT
    if dist.is_initialized():
        dist.destroy_process_group()
    _CURRENT = None


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
