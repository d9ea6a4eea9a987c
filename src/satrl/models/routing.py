"""Capture and replay of MoE routing (R3, docs/design.md "R3").

Hugging Face MoE layers (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral in transformers 5.x) route through a
``*TopKRouter`` module whose forward maps hidden states [N, H] (N = B*L tokens, flattened) to
``(router_logits [N, E], router_scores [N, k], router_indices [N, k])``; the sparse block then runs the
experts ``router_indices`` with weights ``router_scores``. Both capture and replay are forward hooks on
these router modules, registered for the duration of a context manager only:

- capture records ``router_indices`` of every MoE layer;
- replay swaps ``router_indices`` for the given experts and recomputes ``router_scores`` from the
  *current* router logits: ``w = softmax(logits)[replayed]``, renormalized over the replayed experts when
  the router normalizes its top-k (``norm_topk_prob``; Mixtral always does). The weights are a function
  of the router logits, so the router still receives gradient; when the replayed experts equal the
  model's own top-k the output is bit-identical to the unhooked forward.

Alignment: routing tensors are ``[B, L, layers, top_k]`` int64, row ``[b, p]`` being the experts used
while processing ``input_ids[b, p]``. The engine's ``Completion.routing`` [T, layers, top_k] holds, for
response token t, the experts of the forward step that *sampled* it, i.e. input position
``prompt_len - 1 + t`` (``satrl.tensors.scoring_slice``); ``pipeline.buffer.collate`` places it into a trainer row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def _routers(model: nn.Module) -> list[nn.Module]:
    """The router modules of ``model`` in layer order (a ``*TopKRouter`` with a ``top_k`` attribute)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k")]


def moe_num_layers(model: nn.Module) -> int:
    """Number of MoE layers (routers) in ``model``; 0 for a dense model."""
    return len(_routers(model))


def moe_top_k(model: nn.Module) -> int:
    """Experts per token of ``model``'s MoE layers; 0 for a dense model."""
    routers = _routers(model)
    return int(routers[0].top_k) if routers else 0


def _require_moe(model: nn.Module) -> list[nn.Module]:
    routers = _routers(model)
    if not routers:
        raise ValueError(
            f"{type(model).__name__} has no MoE router (no '*TopKRouter' module with 'top_k'); "
            "routing capture/replay only applies to MoE models"
        )
    return routers


class RoutingRecorder:
    """Collects the expert indices of each MoE layer during forward passes (see :func:`capture_routing`)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._shape: tuple[int, int] | None = None  # (B, L) of the current forward
        self._layers: list[torch.Tensor | None] = [None] * num_layers

    def _start(self, shape: tuple[int, int]) -> None:
        self._shape = shape

    def _record(self, layer: int, indices: torch.Tensor) -> None:
        self._layers[layer] = indices.detach()

    def take(self) -> torch.Tensor:
        """Experts of the last forward pass, ``[B, L, layers, top_k]`` int64 (row [b, p] = token input_ids[b, p])."""
        if self._shape is None or any(x is None for x in self._layers):
            raise RuntimeError(
                "no routing recorded: run a forward pass of the model inside capture_routing()"
            )
        b, l = self._shape
        out = torch.stack([x.reshape(b, l, -1) for x in self._layers], dim=2)  # type: ignore[union-attr]
        return out.to(torch.int64)


def _block_shape_hook(recorder: RoutingRecorder):
    def hook(_module: nn.Module, args: tuple) -> None:
        hidden = args[0]  # [B, L, H] as given to the sparse MoE block
        recorder._start((hidden.shape[0], hidden.shape[1]) if hidden.dim() == 3 else (1, hidden.shape[0]))

    return hook


@contextmanager
def capture_routing(model: nn.Module) -> Iterator[RoutingRecorder]:
    """Record the top-k experts every MoE layer uses. Usage::

        with capture_routing(model) as rec:
            model(input_ids)
            routing = rec.take()  # [B, L, layers, top_k]

    Works for full-sequence and incremental (KV-cache) forwards alike: ``take()`` always returns the
    last forward's tokens. Hooks are removed on exit.
    """
    routers = _require_moe(model)
    rec = RoutingRecorder(len(routers))
    parents = {id(child): parent for parent in model.modules() for child in parent.children()}
    handles = []
    for i, router in enumerate(routers):
        handles.append(router.register_forward_hook(lambda _m, _a, out, i=i: rec._record(i, out[2])))
        # the router sees flattened tokens [B*L, H]; its parent block still knows (B, L)
        handles.append(parents[id(router)].register_forward_pre_hook(_block_shape_hook(rec)))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


class RoutingReplayer:
    """Holds the routing replayed by :func:`replay_routing` for one full-sequence forward."""

    def __init__(self, routing: torch.Tensor, num_layers: int, top_k: int) -> None:
        if routing.dim() != 4 or routing.shape[2] != num_layers or routing.shape[3] != top_k:
            raise ValueError(
                f"routing must be [B, L, layers={num_layers}, top_k={top_k}] aligned with input_ids, "
                f"got shape {tuple(routing.shape)}"
            )
        self.routing, self.num_layers, self.top_k = routing.to(torch.int64), num_layers, top_k

    def experts(self, layer: int, n_tokens: int) -> torch.Tensor:
        """Replayed experts of ``layer`` for the N = B*L tokens of this forward, [N, top_k]."""
        b, l = self.routing.shape[:2]
        if b * l != n_tokens:
            raise ValueError(
                f"replay routing covers B*L = {b}*{l} = {b * l} tokens but the MoE layer got {n_tokens}; "
                "routing must be aligned with the input_ids of the forward pass"
            )
        return self.routing[:, :, layer].reshape(n_tokens, self.top_k)


def replay_gate(
    router: nn.Module, logits: torch.Tensor, indices: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """Gate weights of the experts ``indices`` [N, k] from router ``logits`` [N, E]:
    softmax over all experts, gathered, renormalized over the k experts if the router normalizes its top-k.
    Same operations as the HF router, so own top-k indices give bit-identical weights."""
    probs = torch.softmax(logits.float(), dim=-1)  # [N, E]
    w = probs.gather(-1, indices)  # [N, k]
    if getattr(router, "norm_topk_prob", True):  # Mixtral's router has no flag and always normalizes
        w = w / w.sum(dim=-1, keepdim=True)
    return w.to(out_dtype)


def _replay_hook(replayer: RoutingReplayer, layer: int):
    def hook(router: nn.Module, _args: tuple, out: tuple) -> tuple:
        logits, scores, own = out  # [N, E], [N, k], [N, k]
        given = replayer.experts(layer, own.shape[0]).to(own.device)
        use_own = (given < 0).any(dim=-1, keepdim=True)  # [N, 1]: -1 = not recorded, keep own top-k
        indices = torch.where(use_own, own, given)
        if indices.max() >= logits.shape[-1]:
            raise ValueError(f"replayed expert index {int(indices.max())} >= num_experts {logits.shape[-1]}")
        return logits, replay_gate(router, logits, indices, scores.dtype), indices

    return hook


@contextmanager
def replay_routing(model: nn.Module, routing: torch.Tensor) -> Iterator[RoutingReplayer]:
    """Make every MoE layer use the experts in ``routing`` [B, L, layers, top_k] int64 (aligned with the
    forward's ``input_ids`` [B, L]; a token with any entry -1 uses the model's own top-k). Gate weights
    come from the model's router logits renormalized over the replayed experts (see :func:`replay_gate`),
    so the router keeps its gradient."""
    routers = _require_moe(model)
    replayer = RoutingReplayer(routing, len(routers), int(routers[0].top_k))
    # prepend: replay runs before any capture hook, so a recorder always sees the experts actually used
    handles = [
        r.register_forward_hook(_replay_hook(replayer, i), prepend=True) for i, r in enumerate(routers)
    ]
    try:
        yield replayer
    finally:
        for h in handles:
            h.remove()

