"""The per-module rules of the batched score norms (:mod:`satrl.training.score_norms`): for each covered module
type, what its call keeps and how its parameters' per-row gradients are rebuilt from (input, output gradient).

A rule records one call of its module: ``record(module, args, output, tape) -> _Record | None`` (None: nothing
of it is trainable), run as a forward hook; or, for modules whose parameters are used inside the forward's own
arithmetic (MoE experts stored as 3-D parameters), ``patch(module, tape)``: a context in which the module's
forward is an instrumented copy of the eager one that records per expert. ``params(module)``: the trainable
parameters it covers, so that a parameter no rule covers is refused by name. Rules are chosen by the module's
class name (:data:`RULES`), the one place a name picks one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from satrl.registry import Registry


class ScoreNormError(ValueError):
    """A model the batched score norms cannot cover exactly (one line, naming the parameter or module)."""


@dataclass
class Outer:
    """One use of a (block of a) parameter: G_b = sum_n left[b, n] (x) right[b, n]. ``left`` [B, N, o] float, or
    [B, N] int: the one-hot rows of an o-row table (an embedding's token ids); ``right`` [B, N, i]."""

    left: Tensor
    right: Tensor
    rows: int


@dataclass
class Dense:
    """One use of a parameter whose per-row gradient is materialized: ``value`` [B, *shape]."""

    value: Tensor


Use = Outer | Dense
Key = tuple[int, int]  # (id(parameter), block): an expert's block of a 3-D parameter, -1 for the whole


@dataclass
class Record:
    """What one hooked call left: the tensors to differentiate (``outputs``), and ``build``, which turns their
    gradients into ``(key, use)`` pairs. Blocks of one parameter are disjoint; uses with one key are summed
    before the norm (the tied embedding and LM head)."""

    outputs: list[Tensor]
    build: Callable[[list[Tensor | None]], list[tuple[Key, Use]]]


@dataclass
class Tape:
    """The records of one forward over ``rows`` rows; products run in ``dtype``."""

    rows: int
    dtype: torch.dtype
    records: list[Record] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    params: Callable[[nn.Module], list[nn.Parameter]]
    record: Callable[[nn.Module, tuple, object, Tape], Record | None] | None = None
    patch: Callable[[nn.Module, Tape], contextlib.AbstractContextManager] | None = None


RULES: Registry[Rule] = Registry("score-norm rule")


def per_row(t: Tensor, tape: Tape) -> Tensor:
    """``t`` [B, ..., last] or [B*L, last] as [B, N, last] in the tape's dtype."""
    return t.reshape(tape.rows, -1, t.shape[-1]).to(tape.dtype)


def key(p: nn.Parameter, block: int = -1) -> Key:
    return id(p), block


def trainable(*ps) -> list[nn.Parameter]:
    return [p for p in ps if p is not None and p.requires_grad]


def _linear(m: nn.Module, args: tuple, out: Tensor, tape: Tape) -> Record | None:
    if not trainable(m.weight, m.bias) or not out.requires_grad:
        return None
    a = args[0].detach()

    def build(grads):
        (g,) = grads
        if g is None:
            return []
        g = per_row(g, tape)
        uses = [(key(m.weight), Outer(g, per_row(a, tape), m.weight.shape[0]))] if m.weight.requires_grad else []
        if m.bias is not None and m.bias.requires_grad:
            uses.append((key(m.bias), Dense(g.sum(1))))
        return uses

    return Record([out], build)


def _embedding(m: nn.Module, args: tuple, out: Tensor, tape: Tape) -> Record | None:
    if not m.weight.requires_grad or not out.requires_grad:
        return None
    ids = args[0].reshape(tape.rows, -1)

    def build(grads):
        (g,) = grads
        return [] if g is None else [(key(m.weight), Outer(ids, per_row(g, tape), m.weight.shape[0]))]

    return Record([out], build)


def _rmsnorm(m: nn.Module, args: tuple, out: Tensor, tape: Tape) -> Record | None:
    """``weight * x / rms(x)`` as the Llama / Qwen families compute it (the weight multiplies, not ``1 +
    weight`` as Gemma's does: that class is not registered)."""
    if not m.weight.requires_grad or not out.requires_grad:
        return None
    x = args[0].detach()

    def build(grads):
        (g,) = grads
        if g is None:
            return []
        xf = x.to(torch.float32)
        xhat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)).to(x.dtype)
        return [(key(m.weight), Dense((per_row(g, tape) * per_row(xhat, tape)).sum(1)))]

    return Record([out], build)


def _router(m: nn.Module, args: tuple, out: tuple, tape: Tape) -> Record | None:
    """Qwen3-MoE's top-k router: ``logits = hidden @ weight.T`` (its first output), then softmax and top-k, whose
    gradient reaches the weight through the logits."""
    logits = out[0]
    if not m.weight.requires_grad or not logits.requires_grad:
        return None
    a = args[0].detach().reshape(-1, m.weight.shape[1])

    def build(grads):
        (g,) = grads
        return [] if g is None else [(key(m.weight), Outer(per_row(g, tape), per_row(a, tape), m.weight.shape[0]))]

    return Record([logits], build)


def _row_slots(token_idx: Tensor, n: int, rows: int) -> tuple[Tensor, int]:
    """Where an expert's tokens go in a compact per-row layout: token ``token_idx[j]`` of the flattened [n = B*L]
    batch to slot ``row * width + rank in its row``, ``width`` the most tokens of one row the expert took. A row
    holds only this expert's tokens (about L k / E of L), so its grams are that much smaller than [L, L]."""
    row = token_idx // (n // rows)
    order = torch.sort(row, stable=True).indices
    counts = torch.bincount(row, minlength=rows)
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device) - starts[row[order]]
    return row * width + rank, max(width, 1)


def _scatter_rows(v: Tensor, slots: Tensor, width: int, tape: Tape) -> Tensor:
    """An expert's per-token ``v`` [n_e, d] in its compact per-row layout [B, width, d] (zeros past a row's
    tokens, which contribute nothing)."""
    return v.new_zeros(tape.rows * width, v.shape[-1]).index_copy(0, slots, v).reshape(tape.rows, width, -1).to(tape.dtype)


def _expert_record(m: nn.Module, e: int, token_idx: Tensor, n: int, x: Tensor, gu: Tensor, h: Tensor,
                   y: Tensor, tape: Tape) -> Record:  # fmt: skip
    def build(grads):
        g_gu, g_y = grads
        slots, width = _row_slots(token_idx, n, tape.rows)
        uses = []
        if g_gu is not None and m.gate_up_proj.requires_grad:
            uses.append((key(m.gate_up_proj, e), Outer(_scatter_rows(g_gu, slots, width, tape),
                                                       _scatter_rows(x, slots, width, tape), gu.shape[-1])))
        if g_y is not None and m.down_proj.requires_grad:
            uses.append((key(m.down_proj, e), Outer(_scatter_rows(g_y, slots, width, tape),
                                                    _scatter_rows(h, slots, width, tape), y.shape[-1])))
        return uses

    return Record([gu, y], build)


@contextlib.contextmanager
def _experts_patch(m: nn.Module, tape: Tape) -> Iterator[None]:
    """Qwen3-MoE's experts (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) with transformers' eager
    forward, recording each hit expert's input, gate-up output, activation and down output. transformers may
    run the experts another way (``grouped_mm`` on CPU in fp32); the arithmetic is the same up to rounding.
    Another layout (transposed, interleaved, biased, ungated) is refused by name, not approximated."""
    layout = {"is_transposed": False, "is_concatenated": True, "has_bias": False, "has_gate": True,
              "has_post_expert_norm": False}  # fmt: skip
    off = [k for k, v in layout.items() if getattr(m, k, v) != v]
    if off:
        raise ScoreNormError(f"per-sequence score norms: {type(m).__name__} with {', '.join(off)} has no rule (the "
                         "experts rule covers transformers' concatenated, gated, bias-free layout)")

    def forward(hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = F.one_hot(top_k_index, num_classes=m.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit[:, 0].tolist():
            if e == m.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[e])
            x = hidden_states[token_idx]
            gu = F.linear(x, m.gate_up_proj[e])
            gate, up = gu.chunk(2, dim=-1)
            h = m.act_fn(gate) * up
            y = F.linear(h, m.down_proj[e])
            final.index_add_(0, token_idx, (y * top_k_weights[token_idx, top_k_pos, None]).to(final.dtype))
            if gu.requires_grad:
                n = hidden_states.shape[0]
                tape.records.append(_expert_record(m, e, token_idx, n, x.detach(), gu, h.detach(), y, tape))
        return final

    m.forward = forward  # an instance attribute for this pass only: the class's forward is untouched
    try:
        yield
    finally:
        del m.forward


RULES.register("Linear", Rule(lambda m: trainable(m.weight, m.bias), record=_linear))
RULES.register("Embedding", Rule(lambda m: trainable(m.weight), record=_embedding))
for _name in ("Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm"):
    RULES.register(_name, Rule(lambda m: trainable(m.weight), record=_rmsnorm))
RULES.register("Qwen3MoeTopKRouter", Rule(lambda m: trainable(m.weight), record=_router))
RULES.register("Qwen3MoeExperts", Rule(lambda m: trainable(m.gate_up_proj, m.down_proj), patch=_experts_patch))
