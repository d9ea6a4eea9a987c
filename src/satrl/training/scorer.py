"""The policy's log-probs as the trainer computes them: one forward per microbatch of a plan, in the compute
dtype, with the run's temperature, chunking and MoE routing, under the current weights or a snapshot's.

:class:`Scorer` is what the :class:`~satrl.training.trainer.Trainer`'s step, the batch loop's pi_old and
per-version log-probs, and the advantages' score norms (:class:`satrl.training.baselines.Advantages`) share, so
that every one of them sees the same numbers for the same rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.func import functional_call

from satrl.dtypes import CONFIG_DTYPES
from satrl.training.logprobs import (
    chunk_for_vocab,
    full_logits_bytes,
    resolve_chunk_tokens,
    response_logp,
    vocab_size,
)
from satrl.training.microbatches import (
    Micro,
    length_order,
    plan_microbatches,
    row_slice,
    split_rows,
    to_device,
)
from satrl.training.placement import Placement
from satrl.training.settings import TrainerSettings
from satrl.types import Batch

__all__ = ["Scorer"]


class _Scored(torch.nn.Module):
    """Holds the policy as a submodule so that ``functional_call`` can run any function of it (the chunked
    log-prob path calls the decoder and the LM head separately) with a snapshot's tensors swapped in."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[[torch.nn.Module], torch.Tensor]) -> torch.Tensor:
        return fn(self.policy)


class Scorer:
    """Log-probs of the trainer's policy ``model`` (placed by ``placement``) with ``settings``' options.

    ``microbatch_tokens`` is the trainer's cut (the whole minibatch under ``quantile_scope=batch``), so a
    forward here runs on the same rows as the step's."""

    def __init__(self, model: torch.nn.Module, placement: Placement, settings: TrainerSettings,
                 microbatch_tokens: int) -> None:  # fmt: skip
        self.model, self.placement, self.settings = model, placement, settings
        self.device = torch.device(settings.device)
        self.compute_dtype = CONFIG_DTYPES[settings.dtype]
        self.microbatch_tokens = microbatch_tokens
        self.chunk_tokens = resolve_chunk_tokens(settings.logprob_chunk_tokens, model)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute-dtype context of every forward (nothing at all in fp32, so fp32 numbers are unchanged)."""
        if self.settings.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def routing(self, mb: Batch) -> torch.Tensor | None:
        """The engine's MoE routing to replay in the forward (``r3``), or None."""
        if self.settings.r3 and mb.routing is None:  # replaying nothing would silently turn R3 off
            raise ValueError(
                "r3=true but these samples carry no MoE routing: the engine did not capture it "
                "(use engine=torch, or an engine build that returns routed experts), or set r3=false"
            )
        return mb.routing if self.settings.r3 else None

    def logp(self, model: torch.nn.Module, m: Batch, plan: Micro, capture: bool = False):
        """``response_logp`` of microbatch ``m`` with the host-side facts of its plan entry (no host sync): the
        decoder on its longest row, the LM head on its longest response (a plain ``(start, end, longest,
        padded)`` tuple: on the batch's whole response width)."""
        chunk = self.chunk_tokens
        self._check_full_logits(plan, chunk)
        with self.autocast():
            return response_logp(model, m, self.settings.temperature, self.routing(m), capture, length=plan.longest,
                                 padded=plan.padded, chunk_tokens=chunk,
                                 width=plan.width, compiled=self.settings.compile)  # fmt: skip

    def _check_full_logits(self, p: Micro, chunk: int) -> None:
        """On CUDA with ``logprob_chunk_tokens=0``: refuse a microbatch whose full-vocabulary logits would not fit
        in the device memory free now (an estimate, :func:`full_logits_bytes`), before any of it runs."""
        if chunk > 0 or self.device.type != "cuda":
            return
        need = full_logits_bytes(p.end - p.start, p.longest, p.width, vocab_size(self.model), self.compute_dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        if need > free:
            raise MemoryError(
                f"logprob_chunk_tokens=0: a microbatch of {p.end - p.start} rows x {p.longest} tokens needs about "
                f"{need / 2**30:.1f} GiB of full-vocabulary logits, {free / 2**30:.1f} GiB is free on {self.device}; "
                f"set train.logprob_chunk_tokens=auto (chunks of {chunk_for_vocab(vocab_size(self.model))} tokens) or "
                "lower train.microbatch_tokens"
            )

    @torch.no_grad()
    def logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        """Log-probs under other weights (a snapshot), or under the current ones if ``state`` is None.

        On one device a snapshot runs through the policy's own modules with its tensors swapped in
        (``functional_call``): no second model is kept, and its weights come to the device for this call only
        (:meth:`Placement.swapped`); at lag 0 this equals the current forward bit for bit."""
        if self.settings.microbatch_order == "by_length":  # the same rows, cut as the step cuts them; back in batch order
            order = length_order(mb)
            return self._logp_with(state, split_rows(mb, order))[torch.argsort(order)]
        return self._logp_with(state, mb)

    def _logp_with(self, state: dict[str, torch.Tensor] | None, mb: Batch) -> torch.Tensor:  # [B, T]
        plan = plan_microbatches(mb, self.microbatch_tokens)
        dev_mb = to_device(mb, self.device)
        with contextlib.ExitStack() as stack:
            tensors = None if state is None else stack.enter_context(self.placement.swapped(self.model, state))
            if tensors is None:  # the current weights, or the snapshot is in the parameters for now
                return torch.cat([self.logp(self.model, row_slice(dev_mb, p[0], p[1]), p)[0] for p in plan]).cpu()
            swapped = {f"policy.{k}": v for k, v in tensors.items()}
            scored = _Scored(self.model)
            pieces = []
            for p in plan:
                m = row_slice(dev_mb, p[0], p[1])
                pieces.append(functional_call(scored, swapped, (lambda model, m=m, p=p: self.logp(model, m, p)[0],),
                                              tie_weights=False, strict=False))  # fmt: skip
            return torch.cat(pieces).cpu()
