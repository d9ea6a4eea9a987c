"""Where the trainer's weights live, and so how a step's work is spread: the seam between the
:class:`~satrl.training.trainer.Trainer` and data parallel.

The trainer computes one optimizer step over a minibatch and never asks which process it runs in. Everything
that depends on where the parameters are is a method of its :class:`Placement`:

- :class:`OneDevice` (here): the policy whole on one device; every microbatch runs here.
- :class:`satrl.training.sharded.Sharded`: FSDP2 shards over the ranks of a torchrun job; each rank runs whole
  microbatches and the per-microbatch results come back to every rank (docs/design.md, "Data parallel").

A placement holds no training state of its own: the trainer passes the model and optimizer it owns.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from satrl.dtypes import CONFIG_DTYPES
from satrl.training.microbatches import Micro
from satrl.weights.buckets import Bucket, aliases, buckets, copy_buckets
from satrl.weights.snapshot import Snapshot

__all__ = ["OneDevice", "Placement", "StepOutputs", "StepPieces", "WeightExport", "cpu_copy"]

TOKEN_FIELDS = ("logp", "gate", "clipped", "d", "routing")  # the per-token outputs, in the order they are gathered


@dataclass
class StepPieces:
    """What the microbatches one process ran in a step gave back, in :meth:`Placement.assigned`'s order: each
    one's share of the loss (0-dim float64, detached), its objective metrics (0-dim) and its per-token tensors
    (rows of the microbatch: ``logp`` [b, T] detached, the objective's ``gate`` / ``clipped`` [b, T] bool and
    ``d`` [b, T]; ``routing`` [b, T, L, k], the experts the forward used, only on a MoE policy with engine routing)."""

    losses: list[torch.Tensor] = field(default_factory=list)
    metrics: list[dict[str, torch.Tensor]] = field(default_factory=list)
    logp: list[torch.Tensor] = field(default_factory=list)
    gate: list[torch.Tensor] = field(default_factory=list)
    clipped: list[torch.Tensor] = field(default_factory=list)
    d: list[torch.Tensor] = field(default_factory=list)
    routing: list[torch.Tensor] = field(default_factory=list)

    def outputs(self, losses: list[torch.Tensor], metrics: list[dict[str, torch.Tensor]],
                join: Callable[[list[torch.Tensor]], torch.Tensor]) -> StepOutputs:  # fmt: skip
        """The step's :class:`StepOutputs`: ``losses`` and ``metrics`` of every microbatch, each per-token field
        joined by ``join`` (in :data:`TOKEN_FIELDS` order: under data parallel each join is a collective)."""
        tokens = {k: join(getattr(self, k)) for k in TOKEN_FIELDS if getattr(self, k)}
        return StepOutputs(losses, metrics, routing=tokens.pop("routing", None), **tokens)


@dataclass(frozen=True)
class StepOutputs:
    """One optimizer step's results over the whole minibatch, the same on every process: every microbatch's loss
    share and metrics in plan order, and the per-token tensors of all B rows ([B, T]; ``routing`` [B, T, L, k]
    or None, see :class:`StepPieces`)."""

    losses: list[torch.Tensor]
    metrics: list[dict[str, torch.Tensor]]
    logp: torch.Tensor
    gate: torch.Tensor
    clipped: torch.Tensor
    d: torch.Tensor
    routing: torch.Tensor | None = None


def cpu_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model``'s state dict (the one place the trainer copies weights off the model)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class Placement(Protocol):
    """What the trainer asks of the place its weights live in (one device, or shards across ranks)."""

    def place(self, model: torch.nn.Module, uses_ref: bool, device: torch.device, dtype: str
              ) -> tuple[torch.nn.Module, torch.nn.Module | None]:  # fmt: skip
        """The policy to train (fp32 master weights) and, if ``uses_ref``, a frozen reference in compute ``dtype``."""
        ...

    def assigned(self, plan: list[Micro]) -> list[tuple[Micro, bool]]:
        """The microbatches this process runs, each with whether it counts (False: a zero-weight copy that
        runs only so that every process runs the same number of forwards)."""
        ...

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        """A CPU tensor each process filled for its own microbatches' rows (zeros elsewhere), summed over the
        processes, on CPU: every row's value on every process (itself on one device)."""
        ...

    def gathered(self, plan: list[Micro], rows: int, pieces: StepPieces) -> StepOutputs:
        """Every microbatch's loss and metrics in plan order, and the per-token tensors of all ``rows``, from
        the pieces this process ran (in :meth:`assigned`'s order)."""
        ...

    def grads_finite(self, model: torch.nn.Module) -> torch.Tensor:
        """Whether every gradient is finite, as a 0-dim bool tensor (no host sync), the same everywhere."""
        ...

    def clip_grads(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip the gradients' global norm to ``max_norm``; returns the norm before clipping."""
        ...

    def weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full weights as a detached CPU copy (empty where this process does not hold them)."""
        ...

    def buckets(self, model: torch.nn.Module, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """The full weights as a stream of flat buckets (:mod:`satrl.weights.buckets`)."""
        ...

    def load(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights from a full state dict."""
        ...

    def swapped(self, model: torch.nn.Module, state: dict[str, torch.Tensor]
                ) -> contextlib.AbstractContextManager[dict[str, torch.Tensor] | None]:  # fmt: skip
        """Around forwards under a snapshot's weights: yields the tensors to call the policy with
        (``functional_call``), or None where the snapshot was put into the parameters in place (and is taken
        out on exit, the current weights back bit for bit)."""
        ...

    def optimizer_state(self, opt: torch.optim.Optimizer) -> dict:
        """What a checkpoint's state.json-side state holds of the optimizer ({} where it goes to shards)."""
        ...

    def load_optimizer_state(self, opt: torch.optim.Optimizer, state: dict) -> None:
        """Restore what :meth:`optimizer_state` gave (refusing a checkpoint written by another placement)."""
        ...

    def write(self, path: Path | None, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        """Write the state kept in shards into checkpoint folder ``path`` (nothing for one device; under data
        parallel rank 0 names the folder, the other ranks pass None)."""
        ...

    def read(self, path: Path | None, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        """Read what :meth:`write` wrote."""
        ...

    def engine_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy as one plain module, for an engine to copy (its weights then come from :meth:`weights`)."""
        ...


class OneDevice:
    """The whole policy on ``device``: every microbatch runs here, nothing is sharded."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def place(self, model, uses_ref, device, dtype):
        # The reference is copied before the policy moves, so the device never holds an fp32 copy of it.
        ref = None
        if uses_ref:
            ref = copy.deepcopy(model).to(device, CONFIG_DTYPES[dtype]).eval().requires_grad_(False)
        return model.float().to(device).train(), ref

    def assigned(self, plan):
        return [(p, True) for p in plan]

    def summed(self, values):
        return values

    def gathered(self, plan, rows, pieces):
        return pieces.outputs(pieces.losses, pieces.metrics, torch.cat)

    def grads_finite(self, model):
        grads = [torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None]
        return torch.stack(grads).all() if grads else torch.ones((), dtype=torch.bool, device=self.device)

    def clip_grads(self, model, max_norm):
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    def weights(self, model):
        return cpu_copy(model)

    def buckets(self, model, dtype, bucket_bytes):
        return buckets(model, dtype, bucket_bytes)

    def load(self, model, weights):
        model.load_state_dict(weights)

    @contextlib.contextmanager
    def swapped(self, model, state):
        own = model.state_dict()
        if state.keys() != own.keys():
            raise ValueError("snapshot weights do not match the policy's state dict keys")
        # In the dtype of the tensors they replace (fp32 master weights): under bf16 autocast a bf16 copy would
        # run the norms and the embedding in bf16 and show a policy lag where there is none.
        yield {k: v.to(self.device, own[k].dtype) for k, v in state.items()}

    def optimizer_state(self, opt):
        return {"opt": opt.state_dict()}

    def load_optimizer_state(self, opt, state):
        if "opt" not in state:  # its optimizer state is in DCP shards (satrl.training.sharded)
            raise ValueError("written by a data-parallel run: resume it under torchrun")
        opt.load_state_dict(state["opt"])

    def write(self, path, model, opt):
        pass  # everything is in the state dicts

    def read(self, path, model, opt):
        pass

    def engine_model(self, model):
        return model


class WeightExport:
    """The trainer's weights on their way out, and back in: the CPU copy an engine, the snapshot store, the
    evaluator and a checkpoint share, the bucket stream, the shards a checkpoint holds, all through ``placement``.

    ``version`` reads the trainer's current version: a copy is kept for one version at most (:meth:`drop` at
    each optimizer step and each load)."""

    def __init__(self, placement: Placement, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 version: Callable[[], int], snapshot_cut: tuple[torch.dtype | None, int] | None = None) -> None:  # fmt: skip
        self.placement, self.model, self.opt, self.version = placement, model, opt, version
        self._copy: tuple[int, dict[str, torch.Tensor]] | None = None  # (version, CPU copy): see weights()
        # What snapshot() makes: None, the CPU copy; (dtype, bucket_bytes), the bucket stream cut so
        # (TrainerSettings.snapshot_cut, which the run derives from its transport and the engine's dtype).
        self.snapshot_cut = snapshot_cut

    def snapshot(self) -> Snapshot:
        """This version as the snapshot store keeps it (``SnapshotStore.update`` calls this only for a version a
        pending batch needs): the CPU copy (:meth:`weights`) where ``snapshot_cut`` is None, else the bucket
        stream (:meth:`buckets`) in its dtype, read to its end now and kept as it came."""
        if self.snapshot_cut is None:
            return Snapshot.of_state(self.weights())
        dtype, bucket_bytes = self.snapshot_cut
        return Snapshot.of_buckets(self.buckets(dtype, bucket_bytes), aliases(self.model), dtype, bucket_bytes)

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached CPU copy of the current weights, safe to hand to an engine or a checkpoint (empty on a
        data-parallel rank other than 0).

        Copied at most once per version: the loop pushes them to the engine and the snapshot store, the
        evaluator and the checkpoint read them at the same version, and all get the same dict (treat it as
        read-only). The copy is dropped at the next optimizer step, or when the weights are loaded."""
        if not self.held():
            self._copy = (self.version(), self.placement.weights(self.model))
        return self._copy[1]

    def held(self) -> bool:
        """Whether :meth:`weights` would return the copy it holds (no gathering, no copy)."""
        return self._copy is not None and self._copy[0] == self.version()

    def drop(self) -> None:
        """Forget the held copy (the weights are about to change)."""
        self._copy = None

    def buckets(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """The current weights as a stream of flat buckets in ``dtype`` (None: as held), tied weights once
        (``satrl.weights.buckets``): at most one bucket on the host at a time, never a full fp32 copy. The
        ``dist`` transport's source; consume it to the end before the next step. Where this version's copy is
        held already (:meth:`weights`) they are cut from it, the same bits without a second copy off the model
        (under data parallel, the copy every rank gathered at a sync point)."""
        if self.held():
            return copy_buckets(self._copy[1], aliases(self.model), dtype, bucket_bytes)
        return self.placement.buckets(self.model, dtype, bucket_bytes)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights (resume from a checkpoint)."""
        self.placement.load(self.model, weights)
        self.drop()

    def write_shards(self, path: Path | None) -> None:
        """Write the state the placement keeps in shards into checkpoint folder ``path`` (none on one device;
        under data parallel every rank writes its own, into the folder rank 0 names: the others pass None)."""
        self.placement.write(path, self.model, self.opt)

    def read_shards(self, path: Path | None) -> None:
        """Read what :meth:`write_shards` wrote (``path`` as there)."""
        self.placement.read(path, self.model, self.opt)
        self.drop()

    def engine_model(self) -> torch.nn.Module:
        """The policy as one module, for an engine to copy (its weights then come from :meth:`weights`)."""
        return self.placement.engine_model(self.model)
