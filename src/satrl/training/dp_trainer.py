"""The data-parallel trainer: the one-device :class:`~satrl.training.trainer.Trainer` over an FSDP2 policy.

SAT's semantics do not depend on the world size. A step cuts its minibatch into microbatches exactly as one
device does (:func:`~satrl.training.trainer.plan_microbatches`, on the whole minibatch, which every rank
holds) and gives whole microbatches to ranks, round robin; a rank with fewer than the others runs a
zero-weight copy of the cheapest one, so that every rank runs the same number of forwards and backwards
(FSDP's collectives must line up). A microbatch's forward sees the same weights and rows as on one device,
so its log-probs, its SAT quantile q and its metrics are the same numbers; FSDP sums the gradients across
ranks (each microbatch's loss carries its share of the minibatch), so only the order of that sum differs.
Each microbatch's loss and metrics and every per-token tensor then come to every rank (a sum over ranks of
tensors that are zero where another rank owns the value), and reduce exactly as on one device.

Rank 0 announces each call that needs the others on the control channel (:mod:`satrl.training.dp`); the
others receive it in :meth:`DPTrainer.follow`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from satrl.dtypes import dtype_name, named_dtype
from satrl.models.loading import meta_copy
from satrl.objectives.step_size import advantage_rule
from satrl.training import dp as dpm
from satrl.training.dist_channel import Message
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer, plan_microbatches
from satrl.types import Batch
from satrl.weights.buckets import Bucket

BATCH_FIELDS = ("input_ids", "attention_mask", "prompt_len", "mask", "response_ids", "behavior_logp", "versions",
                "rewards", "group_index", "routing")  # fmt: skip
SHARDS = "shards"  # a checkpoint's DCP folder: model and optimizer, one safetensors file per rank


def _batch_tensors(b: Batch) -> list[torch.Tensor | None]:
    return [getattr(b, f) for f in BATCH_FIELDS]


def _batch_of(tensors: list[torch.Tensor | None]) -> Batch:
    return Batch(**dict(zip(BATCH_FIELDS, tensors)))


class DPTrainer(Trainer):
    """A :class:`Trainer` whose policy (and reference) are sharded with FSDP2 over ``dp.mesh``.

    Extra arguments: ``dp`` (this process's :class:`~satrl.training.dp.DataParallel`), ``template`` (builds
    an unsharded copy of the policy, for an engine to copy). Everything else as :class:`Trainer`."""

    def __init__(self, model: torch.nn.Module, objective, settings: TrainerSettings, *, dp: dpm.DataParallel,
                 template: Callable[[], torch.nn.Module]) -> None:  # fmt: skip
        if advantage_rule(objective) is not None:  # every rank refuses, before any collective
            raise ValueError("data parallel: the objective's advantage baseline (vcpo's baseline=opob) needs "
                             "per-sequence gradients, which the sharded trainer does not compute")
        self.dp, self.template = dp, template
        if dp.leader:
            self._announce(dpm.START)
        # From START on the others build the same trainer, inside collectives: a failure here must end this
        # process (torchrun then stops them), not send them a STOP they cannot receive (a silent deadlock).
        dp.busy = True
        super().__init__(model, objective, replace(settings, device=dp.device))
        dp.busy = False

    def _place(self, model: torch.nn.Module, uses_ref: bool) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """The policy (fp32 master weights) and the reference (compute dtype, forwards only) as FSDP2 shards,
        with no full copy of the weights on any device and none on the other ranks' hosts.

        Rank 0 passes the loaded policy on its host; ``fully_shard`` moves one unit at a time to the device and
        keeps this rank's shard. The other ranks may pass the same architecture on the meta device
        (:func:`satrl.models.loading.empty_model`). The reference starts on the meta device everywhere. Every
        shard that starts there is allocated after sharding and filled from rank 0's weights, one parameter
        at a time, buffers included (the non-persistent rotary tables too)."""
        mp = None
        if self.device.type == "cuda" and self.dtype == "bf16":  # bf16 compute, fp32 master weights and reductions
            from torch.distributed.fsdp import MixedPrecisionPolicy

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = model.float().train()
        ref = meta_copy(model).to(self.compute_dtype).eval().requires_grad_(False) if uses_ref else None
        tensors = [*model.named_parameters(), *model.named_buffers()]
        full = {n: t.detach() for n, t in tensors} if self.dp.leader else {}  # rank 0's host copy, as loaded
        self._check_same_architecture(model)
        for module in (model, ref):
            if module is not None:
                dpm.shard(module, self.dp.mesh, mp)
                if module is ref or not self.dp.leader:
                    module.to_empty(device=self.device)
                self._set_full(module, full)
        return model, ref

    # -- the control channel -----------------------------------------------------------------------
    def _announce(self, op: int, tensors=(), ints=(), text: str = "") -> None:
        """Rank 0: tell the others which call comes next (no-op elsewhere: they are already in it)."""
        if self.dp.leader:
            self.dp.channel.send(Message(op, list(ints), text, list(tensors)))

    @contextlib.contextmanager
    def _joined(self, op: int, tensors=(), ints=(), text: str = ""):
        """Around a call the other ranks join: announced first; while inside, an error on rank 0 must not
        release them with a STOP (they are in a collective), so ``dp.busy`` stays set if it raises."""
        self._announce(op, tensors, ints, text)
        self.dp.busy = True
        yield
        self.dp.busy = False

    def follow(self, msg: Message) -> None:
        """Ranks > 0: join the call rank 0 announced."""
        if msg.op == dpm.STEP:
            mb, (adv, old, vlogp) = _batch_of(msg.tensors[:-3]), msg.tensors[-3:]
            self.version = msg.ints[0]
            Trainer.step(self, mb, adv, old, vlogp)
        elif msg.op == dpm.LOGP:
            mb = _batch_of(msg.tensors)
            if msg.ints[0]:  # under a snapshot: rank 0 sends its weights
                self._under_snapshot({}, mb)
            else:
                Trainer.logp_with(self, None, mb)
        elif msg.op == dpm.GATHER:
            self.version = msg.ints[0]
            self.weights()
        elif msg.op == dpm.BUCKETS:
            for _ in self.weight_buckets(named_dtype(msg.text) if msg.text else None, msg.ints[0]):
                pass  # every rank gathers each parameter; only rank 0 keeps the buckets
        elif msg.op == dpm.LOAD_WEIGHTS:
            self.load_weights({})
        elif msg.op == dpm.SAVE:
            self.write_shards(Path(msg.text))
        elif msg.op == dpm.LOAD:
            self.version, self.skipped = msg.ints
            self.read_shards(Path(msg.text))
        else:
            raise RuntimeError(f"data parallel: unknown op {msg.op} from rank 0")

    # -- calls the others join ---------------------------------------------------------------------
    def step(self, mb: Batch, adv, old_logp=None, version_logp=None) -> dict[str, float]:
        with self._joined(dpm.STEP, [*_batch_tensors(mb), adv, old_logp, version_logp], [self.version]):
            return super().step(mb, adv, old_logp, version_logp)

    def logp_with(self, state, mb: Batch) -> torch.Tensor:
        """Log-probs under the current weights, or under a snapshot's (rank 0's ``state``; the decomposition):
        every rank runs every microbatch, so the FSDP forwards line up and every rank gets the result."""
        with self._joined(dpm.LOGP, _batch_tensors(mb), ints=[state is not None]):
            return super().logp_with(None, mb) if state is None else self._under_snapshot(state, mb)

    def _check_same_architecture(self, model: torch.nn.Module) -> None:
        """Every rank must hold the same parameters and buffers (a meta copy made with ``Module.to("meta")``
        unties a tied LM head, for one): a mismatch would hang in the first collective, so refuse it here."""
        params, buffers = list(model.parameters()), list(model.buffers())
        mine = torch.tensor([len(params), len(buffers), sum(p.numel() for p in params)], dtype=torch.float64)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.dp.channel.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.dp.channel.group)
        if not torch.equal(lo, hi):
            raise ValueError(
                f"data parallel: the ranks' policies differ (parameters, buffers, numel from {lo.long().tolist()} to "
                f"{hi.long().tolist()}); every rank must build the same architecture, tied weights tied"
            )

    @torch.no_grad()
    def _under_snapshot(self, state: dict[str, torch.Tensor], mb: Batch) -> torch.Tensor:
        """The snapshot's weights go into the shards for this forward only (from rank 0), and the current
        ones come back bit for bit from a copy of this rank's shards: no unsharded second model."""
        _reshard(self.model)
        kept = [p.to_local().clone() for p in self.model.parameters()]
        try:
            self._set_full(self.model, state)
            return super().logp_with(None, mb)
        finally:
            _reshard(self.model)
            for p, k in zip(self.model.parameters(), kept):
                p.to_local().copy_(k)

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

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights on CPU, gathered from the shards: on rank 0; an empty dict elsewhere."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self._weights is None or self._weights[0] != self.version:
            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            with self._joined(dpm.GATHER, ints=[self.version]):
                full, seen = get_model_state_dict(self.model, options=opts), set()
            # On one CPU rank the "gathered" tensors are the live parameters, and a tied weight comes back as one
            # tensor twice: copy those, so that the dict is a snapshot with one tensor per key.
            seen |= {t.to_local().data_ptr() if hasattr(t, "to_local") else t.data_ptr()
                     for t in [*self.model.parameters(), *self.model.buffers()]}  # fmt: skip
            for k, v in full.items():
                if v.data_ptr() in seen:
                    full[k] = v.clone()
                seen.add(v.data_ptr())
            self._weights = (self.version, full)
        return self._weights[1]

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[Bucket]:
        """The full weights as buckets, gathered from the shards one parameter at a time: every rank walks the
        stream together (announced), rank 0 yields it. Consume it to the end: the others are in its collectives."""
        name = dtype_name(dtype) if dtype is not None else ""
        with self._joined(dpm.BUCKETS, ints=[bucket_bytes], text=name):
            _reshard(self.model)  # FSDP keeps the root gathered after a forward: start from plain shards
            yield from super().weight_buckets(dtype, bucket_bytes)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Set the policy's weights from rank 0's full ``weights`` (ignored elsewhere)."""
        with self._joined(dpm.LOAD_WEIGHTS):
            self._set_full(self.model, weights)
        self._weights = None

    def engine_model(self) -> torch.nn.Module:
        return self.template()  # unsharded, for an engine to copy; its weights come from weights()

    # -- checkpoints: model and optimizer as DCP shards; version and counters in state.json ----------
    def state_dict(self) -> dict:
        return {"version": self.version, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.version, self.skipped = state["version"], state["skipped"]
        self._weights = None

    def write_shards(self, path: Path) -> None:
        """Every rank writes its shards of the policy and of AdamW's state into ``path/shards`` (DCP, in
        safetensors with JSON sharding metadata: nothing pickled)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        with self._joined(dpm.SAVE, text=str(path)):
            writer = HuggingFaceStorageWriter(str(path / SHARDS), save_distributed=True)
            dcp.save(self._dcp_state(), storage_writer=writer)

    def read_shards(self, path: Path) -> None:
        """Load the policy and AdamW's state from ``path/shards``, each rank the slices of its own shards (DCP
        reshards: the checkpoint may come from another world size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        with self._joined(dpm.LOAD, ints=[self.version, self.skipped], text=str(path)):
            flat, groups = self._dcp_state(with_groups=True)
            dcp.load(flat, storage_reader=HuggingFaceStorageReader(str(path / SHARDS)))
            optim = {"state": _unflatten(flat, "optim."), "param_groups": groups}
            set_state_dict(self.model, self.opt, model_state_dict=_unflatten(flat, "model.", nested=False),
                           optim_state_dict=optim, options=StateDictOptions(strict=False))  # a tied weight comes once
        self._weights = None

    def _dcp_state(self, with_groups: bool = False):
        """Model and optimizer tensors under flat names (DCP's safetensors storage takes tensors only;
        AdamW's hyper-parameters come from the config), and the optimizer's param groups if asked."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.opt)
        flat, seen = {}, set()
        for k, v in model.items():  # a tied weight (LM head = embeddings) once: safetensors refuses shared memory
            local = v.to_local() if hasattr(v, "to_local") else v
            where = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
            if where not in seen or local.numel() == 0:
                seen.add(where)
                flat[f"model.{k}"] = v
        for name, slots in optim["state"].items():
            flat.update({f"optim.{name}.{slot}": v for slot, v in slots.items() if isinstance(v, torch.Tensor)})
        return (flat, optim["param_groups"]) if with_groups else flat

    # -- the step's microbatches across ranks ------------------------------------------------------
    def _assigned(self, plan: list, mb: Batch) -> list:
        mine = [(p, True) for i, p in enumerate(plan) if i % self.dp.world == self.dp.rank]
        per_rank = -(-len(plan) // self.dp.world)
        cheapest = min(plan, key=lambda p: (p[1] - p[0]) * p[2])
        return mine + [(cheapest, False)] * (per_rank - len(mine))

    def _gathered(self, plan: list, rows: int, losses: list, per_mb: list, tok: dict) -> tuple[list, list, dict]:
        dev, W, r = self.device, self.dp.world, self.dp.rank
        mine = [i for i in range(len(plan)) if i % W == r]  # the first len(mine) pieces are real, in this order
        keys = list(per_mb[0])  # an objective's metric names do not depend on the data: the same on every rank
        table = torch.zeros(len(plan), 1 + len(keys), dtype=torch.float64, device=dev)
        if mine:
            got = [torch.stack([losses[j], *(per_mb[j][k].detach().to(torch.float64) for k in keys)])
                   for j in range(len(mine))]  # fmt: skip
            table.index_copy_(0, torch.tensor(mine, device=dev), torch.stack(got))
        dist.all_reduce(table, group=self.dp.group)  # each row is nonzero on one rank only: the sum is exact
        losses = list(table[:, 0].unbind())
        per_mb = [dict(zip(keys, row.unbind())) for row in table[:, 1:]]
        row_ids = torch.tensor([x for i in mine for x in range(plan[i][0], plan[i][1])], dtype=torch.int64, device=dev)
        return losses, per_mb, {k: self._rows(v[: len(mine)], v[0], rows, row_ids) for k, v in tok.items() if v}

    def _rows(self, pieces: list[torch.Tensor], like: torch.Tensor, rows: int, row_ids: torch.Tensor) -> torch.Tensor:
        """All ``rows`` of a per-token tensor, from the pieces each rank holds (zeros elsewhere, summed)."""
        wire = torch.uint8 if like.dtype == torch.bool else like.dtype
        full = torch.zeros((rows, *like.shape[1:]), dtype=wire, device=self.device)
        if pieces:
            full.index_copy_(0, row_ids, torch.cat(pieces).to(wire))
        dist.all_reduce(full, group=self.dp.group)
        return full.bool() if like.dtype == torch.bool else full

    def _grads_finite(self) -> torch.Tensor:
        local = [torch.isfinite(p.grad.to_local()).all() for p in self.model.parameters() if p.grad is not None]
        bad = (~torch.stack(local).all()).to(torch.float32) if local else torch.zeros((), device=self.device)
        dist.all_reduce(bad, group=self.dp.group)  # the guard decides the same on every rank
        return bad == 0

    def _clip_grads(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


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


__all__ = ["DPTrainer", "plan_microbatches"]
