"""The data-parallel placement: the policy (and reference) as FSDP2 shards over the ranks of a torchrun job.

SAT's semantics do not depend on the world size. A step cuts its minibatch into microbatches exactly as one
device does (:func:`~satrl.training.microbatches.plan_microbatches`, on the whole minibatch, which every rank
holds) and gives whole microbatches to ranks, round robin; a rank with fewer than the others runs a
zero-weight copy of the cheapest one, so that every rank runs the same number of forwards and backwards
(FSDP's collectives must line up). A microbatch's forward sees the same weights and rows as on one device,
so its log-probs, its SAT quantile q and its metrics are the same numbers; FSDP sums the gradients across
ranks (each microbatch's loss carries its share of the minibatch), so only the order of that sum differs.
Each microbatch's loss and metrics and every per-token tensor then come to every rank (a sum over ranks of
tensors that are zero where another rank owns the value), and reduce exactly as on one device.

Every method here is a collective: every rank calls it together. Every rank runs the same batch loop on its own
trainer, so a step's and a forward's collectives line up by construction; the others, whose need depends on what
rank 0 alone does (reading the weights for the snapshot store, an evaluation or a checkpoint), run at the sync
points where rank 0 says so (:mod:`satrl.launch.data_parallel`). Gathering the weights anywhere else is
refused (:meth:`Sharded.weights`): a gather only rank 0 entered would wait forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from satrl.dtypes import CONFIG_DTYPES
from satrl.models.loading import meta_copy
from satrl.training import dp as dpm
from satrl.weights.buckets import aliases, copy_buckets

SHARDS = "shards"  # a checkpoint's DCP folder: model and optimizer, one safetensors file per rank


class Sharded:
    """FSDP2 shards over ``dp.mesh``; ``template()`` builds an unsharded copy of the policy (for an engine)."""

    def __init__(self, dp: dpm.DataParallel, template: Callable[[], torch.nn.Module]) -> None:
        self.dp, self.template, self.device = dp, template, dp.device
        self._synced = False  # inside gathering(): every rank is at the same sync point

    def place(self, model, uses_ref, device, dtype):
        """The policy (fp32 master weights) and the reference (compute dtype, forwards only) as FSDP2 shards,
        with no full copy of the weights on any device and none on the other ranks' hosts.

        Rank 0 passes the loaded policy on its host; ``fully_shard`` moves one unit at a time to the device and
        keeps this rank's shard. The other ranks may pass the same architecture on the meta device
        (:func:`satrl.models.loading.empty_model`). The reference starts on the meta device everywhere. Every
        shard that starts there is allocated after sharding and filled from rank 0's weights, one parameter
        at a time, buffers included (the non-persistent rotary tables too)."""
        mp = None
        if device.type == "cuda" and dtype == "bf16":  # bf16 compute, fp32 master weights and reductions
            from torch.distributed.fsdp import MixedPrecisionPolicy

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = model.float().train()
        ref = meta_copy(model).to(CONFIG_DTYPES[dtype]).eval().requires_grad_(False) if uses_ref else None
        tensors = [*model.named_parameters(), *model.named_buffers()]
        full = {n: t.detach() for n, t in tensors} if self.dp.leader else {}  # rank 0's host copy, as loaded
        self._check_same_architecture(model)
        for module in (model, ref):
            if module is not None:
                dpm.shard(module, self.dp.mesh, mp)
                if module is ref or not self.dp.leader:
                    module.to_empty(device=device)
                self._set_full(module, full)
        return model, ref

    def _check_same_architecture(self, model: torch.nn.Module) -> None:
        """Every rank must hold the same parameters and buffers (a meta copy made with ``Module.to("meta")``
        unties a tied LM head, for one): a mismatch would hang in the first collective, so refuse it here."""
        params, buffers = list(model.parameters()), list(model.buffers())
        mine = torch.tensor([len(params), len(buffers), sum(p.numel() for p in params)], dtype=torch.float64)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.dp.control)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.dp.control)
        if not torch.equal(lo, hi):
            raise ValueError(
                f"data parallel: the ranks' policies differ (parameters, buffers, numel from {lo.long().tolist()} to "
                f"{hi.long().tolist()}); every rank must build the same architecture, tied weights tied"
            )

    @torch.no_grad()
    def _set_full(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Put rank 0's full ``state`` (ignored elsewhere) into ``module``'s parameters in place, one tensor at a
        time, each rank receiving its shard: the optimizer keeps holding the same parameters. Buffers are not
        sharded: every rank gets rank 0's (its own where ``state`` lacks one, as a state dict lacks the
        non-persistent ones, which training never changes)."""
        from torch.distributed.tensor import distribute_tensor

        lead = self.dp.leader
        _reshard(module)
        for name, p in module.named_parameters():
            full = state[name].to(self.device, p.dtype) if lead else torch.empty(p.shape, dtype=p.dtype, device=self.device)
            p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=0).to_local())
        for name, b in module.named_buffers():
            if lead and name in state:
                b.copy_(state[name])
            dist.broadcast(b, src=0, group=self.dp.group)

    # -- a step's microbatches across ranks --------------------------------------------------------
    def assigned(self, plan):
        mine = [(p, True) for i, p in enumerate(plan) if i % self.dp.world == self.dp.rank]
        per_rank = -(-len(plan) // self.dp.world)
        cheapest = min(plan, key=lambda p: (p[1] - p[0]) * p[2])
        return mine + [(cheapest, False)] * (per_rank - len(mine))

    def summed(self, values):
        out = values.to(self.device)
        dist.all_reduce(out, group=self.dp.group)  # each row is nonzero on one rank only: the sum is exact
        return out.cpu()

    def gathered(self, plan, rows, pieces):
        dev, W, r = self.device, self.dp.world, self.dp.rank
        mine = [i for i in range(len(plan)) if i % W == r]  # the first len(mine) pieces are real, in this order
        keys = list(pieces.metrics[0])  # an objective's metric names do not depend on the data: the same on every rank
        table = torch.zeros(len(plan), 1 + len(keys), dtype=torch.float64, device=dev)
        if mine:
            got = [torch.stack([pieces.losses[j], *(pieces.metrics[j][k].detach().to(torch.float64) for k in keys)])
                   for j in range(len(mine))]  # fmt: skip
            table.index_copy_(0, torch.tensor(mine, device=dev), torch.stack(got))
        dist.all_reduce(table, group=self.dp.group)  # each row is nonzero on one rank only: the sum is exact
        losses = list(table[:, 0].unbind())
        metrics = [dict(zip(keys, row.unbind())) for row in table[:, 1:]]
        row_ids = torch.tensor([x for i in mine for x in range(plan[i][0], plan[i][1])], dtype=torch.int64, device=dev)
        return pieces.outputs(losses, metrics, lambda v: self._rows(v[: len(mine)], v[0], rows, row_ids))

    def _rows(self, pieces: list[torch.Tensor], like: torch.Tensor, rows: int, row_ids: torch.Tensor) -> torch.Tensor:
        """All ``rows`` of a per-token tensor, from the pieces each rank holds (zeros elsewhere, summed)."""
        wire = torch.uint8 if like.dtype == torch.bool else like.dtype
        full = torch.zeros((rows, *like.shape[1:]), dtype=wire, device=self.device)
        if pieces:
            full.index_copy_(0, row_ids, torch.cat(pieces).to(wire))
        dist.all_reduce(full, group=self.dp.group)
        return full.bool() if like.dtype == torch.bool else full

    def grads_finite(self, model):
        local = [torch.isfinite(p.grad.to_local()).all() for p in model.parameters() if p.grad is not None]
        bad = (~torch.stack(local).all()).to(torch.float32) if local else torch.zeros((), device=self.device)
        dist.all_reduce(bad, group=self.dp.group)  # the guard decides the same on every rank
        return bad == 0

    def clip_grads(self, model, max_norm):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    # -- the weights ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gathering(self):
        """Around a gather that every rank makes at the same sync point
        (:mod:`satrl.launch.data_parallel`): only inside it may :meth:`weights` run."""
        self._synced = True
        try:
            yield
        finally:
            self._synced = False

    def weights(self, model):
        """The full weights on CPU, gathered from the shards: on rank 0; an empty dict elsewhere. Only inside
        :meth:`gathering`: rank 0 alone may know that it needs them (an evaluation, a checkpoint, the snapshot
        store), and a gather the others did not enter would wait for them forever."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not self._synced:
            raise RuntimeError(
                f"data parallel: rank {self.dp.rank} asked for the full weights outside a sync point, so the other "
                "ranks would not join the gather; rank 0 must say at the sync point before it that it reads them "
                "(satrl.launch.data_parallel)"
            )
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # On one CPU rank the "gathered" tensors are the live parameters, and a tied weight comes back as one
        # tensor twice: copy those, so that the dict is a snapshot with one tensor per key.
        seen = {t.to_local().data_ptr() if hasattr(t, "to_local") else t.data_ptr()
                for t in [*model.parameters(), *model.buffers()]}  # fmt: skip
        for k, v in full.items():
            if v.data_ptr() in seen:
                full[k] = v.clone()
            seen.add(v.data_ptr())
        return full

    def buckets(self, model, dtype, bucket_bytes):
        """Cut from a full gather (:meth:`weights`, so only inside :meth:`gathering`; the trainer cuts them from
        the copy it holds once a sync point gathered it, :meth:`WeightExport.buckets`): on rank 0; none elsewhere."""
        return copy_buckets(self.weights(model), aliases(model), dtype, bucket_bytes)

    def load(self, model, weights):
        self._set_full(model, weights)

    @contextlib.contextmanager
    def swapped(self, model, state):
        """The snapshot's weights go into the shards for these forwards only (from rank 0), and the current
        ones come back bit for bit from a copy of this rank's shards: no unsharded second model."""
        with torch.no_grad():
            _reshard(model)
            kept = [p.to_local().clone() for p in model.parameters()]
            try:
                self._set_full(model, state)
                yield None
            finally:
                _reshard(model)
                for p, k in zip(model.parameters(), kept):
                    p.to_local().copy_(k)

    def engine_model(self, model):
        return self.template()  # unsharded, for an engine to copy; its weights come from weights()

    # -- checkpoints: model and optimizer as DCP shards; version and counters in state.json ----------
    def optimizer_state(self, opt):
        return {}

    def load_optimizer_state(self, opt, state):
        pass  # in the shards (read)

    def write(self, path, model, opt):
        """Every rank writes its shards of the policy and of AdamW's state into ``path/shards`` (DCP, in
        safetensors with JSON sharding metadata: nothing pickled). Rank 0 names the folder (the others pass None)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        writer = HuggingFaceStorageWriter(str(self._folder(path) / SHARDS), save_distributed=True)
        dcp.save(_dcp_state(model, opt), storage_writer=writer)

    def read(self, path, model, opt):
        """Load the policy and AdamW's state from ``path/shards``, each rank the slices of its own shards (DCP
        reshards: the checkpoint may come from another world size). Rank 0 names the folder (the others pass None)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        flat, groups = _dcp_state(model, opt, with_groups=True)
        dcp.load(flat, storage_reader=HuggingFaceStorageReader(str(self._folder(path) / SHARDS)))
        optim = {"state": _unflatten(flat, "optim."), "param_groups": groups}
        set_state_dict(model, opt, model_state_dict=_unflatten(flat, "model.", nested=False),
                       optim_state_dict=optim, options=StateDictOptions(strict=False))  # a tied weight comes once

    def _folder(self, path: Path | None) -> Path:
        """Rank 0's checkpoint folder, on every rank (only rank 0 runs the run directory)."""
        text = torch.tensor(list(str(path).encode()), dtype=torch.uint8) if self.dp.leader else None
        (got,) = dpm.broadcast_tensors(self.dp, [text])
        return Path(bytes(got.tolist()).decode())


def _dcp_state(model: torch.nn.Module, opt: torch.optim.Optimizer, with_groups: bool = False):
    """Model and optimizer tensors under flat names (DCP's safetensors storage takes tensors only; AdamW's
    hyper-parameters come from the config), and the optimizer's param groups if asked."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim = get_state_dict(model, opt)
    flat, seen = {}, set()
    for k, v in model_state.items():  # a tied weight (LM head = embeddings) once: safetensors refuses shared memory
        local = v.to_local() if hasattr(v, "to_local") else v
        where = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
        if where not in seen or local.numel() == 0:
            seen.add(where)
            flat[f"model.{k}"] = v
    for name, slots in optim["state"].items():
        flat.update({f"optim.{name}.{slot}": v for slot, v in slots.items() if isinstance(v, torch.Tensor)})
    return (flat, optim["param_groups"]) if with_groups else flat


def _reshard(module: torch.nn.Module) -> None:
    """Back to sharded parameters (FSDP keeps the root's gathered after a forward)."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _unflatten(flat: dict, prefix: str, nested: bool = True) -> dict:
    """``model.<fqn>`` -> ``{fqn: t}``; ``optim.<fqn>.<slot>`` -> ``{fqn: {slot: t}}``."""
    out: dict = {}
    for k, v in flat.items():
        if not k.startswith(prefix):
            continue
        name = k[len(prefix):]
        if nested:
            fqn, slot = name.rsplit(".", 1)
            out.setdefault(fqn, {})[slot] = v
        else:
            out[name] = v
    return out
