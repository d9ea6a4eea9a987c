"""Per-sequence score norms in one batched pass: ``||grad_theta sum_t log pi(y_bt)||^2`` for every row b.

VCPO's off-policy optimal baseline (:func:`satrl.objectives.vcpo.opob_advantages`) weighs response i by
w_i^2 ||grad log pi(tau_i)||^2. A loop of one-row backwards gives those norms at B times a backward's cost; this
module gives them from **one forward and one backward of the whole microbatch** ("ghost norms", Li, Tramer,
Liang, Hashimoto 2021, arXiv 2110.05679; the mixed per-layer rule of Bu et al.'s book-keeping, arXiv 2210.00038;
as Opacus's fast gradient clipping computes them, ``opacus/grad_sample/*_norm_sample.py``):

1. the forward runs with hooks that keep each covered module's input and output;
2. ``torch.autograd.grad(sum_b sum_t mask * log pi, outputs)``: the backward stops at the covered modules'
   outputs, so it forms no weight gradient and leaves every ``.grad`` alone (under FSDP2: no reduce-scatter).
   Rows of a causal LM do not interact (padding is masked, MoE routing is per token with no capacity drop),
   so row b's output gradient is the gradient of row b's own sum;
3. per parameter, its per-row gradient is rebuilt from (input a, output gradient g) of each of its uses:

   ================  ===============================  ===============================================
   module            per-row gradient G_b             how its norm is taken
   ================  ===============================  ===============================================
   Linear W [o, i]   sum_t g_bt a_bt^T (+ bias sum g)  ghost sum_{t,s}(g_t.g_s)(a_t.a_s) when T(o+i) < o i,
                                                       else materialized [B, o, i] (the mixed rule)
   Embedding [V, H]  sum_t e(x_bt) g_bt^T              summed per (row, token id) (Opacus), O(T H)
   RMSNorm w [H]     sum_t g_bt * xhat_bt              materialized [B, H]
   MoE router [E,H]  a Linear on the router logits     as Linear
   MoE experts       per expert, a Linear over the     as Linear, per expert (experts' blocks are
   [E, o, i]         tokens routed to it                disjoint: no cross term between experts)
   ================  ===============================  ===============================================

A parameter with several uses (a tied embedding and LM head) has ``||sum_u G_u||^2 = sum_u ||G_u||^2 + 2
sum_{u<v} <G_u, G_v>``: the cross terms are computed (a sum of per-module norms, as Opacus takes it, would miss
them). A model with a trainable parameter that no rule covers is refused, naming the parameter.

Shapes: every hooked tensor has the batch's B rows first, or B*L rows flattened (MoE blocks flatten [B, L, H]);
either way ``reshape(B, -1, last)`` lines its tokens up per row. Products run in fp32 at least (fp64 for an
fp64 model), the per-row sums in fp64.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from satrl.training.score_rules import RULES, Dense, Key, Outer, ScoreNormError, Tape, Use

__all__ = ["RULES", "ChunkedHead", "ScoreNormError", "covered_parameters", "parameter_score_norms", "score_norms"]

# The ghost products hold [rows, N, M] grams and the mixed rule [rows, o, i] gradients: rows go in groups that
# keep one such tensor under this many bytes.
WORK_BYTES = 256 << 20


def _groups(B: int, per_row_elems: int) -> Iterator[slice]:
    step = max(1, WORK_BYTES // max(8 * per_row_elems, 1))
    for s in range(0, B, step):
        yield slice(s, min(B, s + step))


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


# -- the algebra: <G_u, G_v> per row for two uses of one parameter block ------------------------------------
def _index_self(u: Outer) -> Tensor:  # [B]
    """||sum_n e(id_n) r_n^T||^2 per row: the r summed per (row, id), squared, summed (Opacus's embedding norm)."""
    B, N = u.left.shape
    rows = torch.arange(B, device=u.left.device).repeat_interleave(N)
    keys, inv = torch.unique(rows * u.rows + u.left.reshape(-1), return_inverse=True)
    summed = u.right.new_zeros(keys.numel(), u.right.shape[-1]).index_add_(0, inv, u.right.reshape(B * N, -1))
    return torch.zeros(B, dtype=torch.float64, device=rows.device).index_add_(
        0, keys // u.rows, _f64(summed.square().sum(-1)))


def _outer_self(u: Outer) -> Tensor:  # [B]
    """The mixed rule: ghost sum_{n,m} (l_n.l_m)(r_n.r_m) when N (o + i) < o i, else the materialized [o, i]."""
    if u.left.dtype in (torch.int32, torch.int64):
        return _index_self(u)
    B, N, o = u.left.shape
    i = u.right.shape[-1]
    ghost = N * (o + i) < o * i
    out = []
    for s in _groups(B, N * N if ghost else o * i):
        L, R = u.left[s], u.right[s]
        if ghost:
            out.append(_f64(((L @ L.transpose(1, 2)) * (R @ R.transpose(1, 2))).sum((1, 2))))
        else:
            out.append(_f64((L.transpose(1, 2) @ R).square().sum((1, 2))))
    return torch.cat(out)


def _left_gram(a: Tensor, b: Tensor) -> Tensor:  # [B, N, M]: l^a_n . l^b_m, either side one-hot (int) or dense
    a_ids, b_ids = a.dtype in (torch.int32, torch.int64), b.dtype in (torch.int32, torch.int64)
    if a_ids and b_ids:
        return a[:, :, None] == b[:, None, :]
    if a_ids:
        return b.gather(2, a[:, None, :].expand(-1, b.shape[1], -1)).transpose(1, 2)
    if b_ids:
        return a.gather(2, b[:, None, :].expand(-1, a.shape[1], -1))
    return a @ b.transpose(1, 2)


def _dense_outer(d: Tensor, u: Outer) -> Tensor:  # [B]: sum_n l_n^T D r_n
    if u.left.dtype in (torch.int32, torch.int64):
        picked = d.gather(1, u.left[..., None].expand(-1, -1, d.shape[-1]))  # D's rows at the ids
    else:
        picked = u.left.to(d.dtype) @ d
    return _f64((picked * u.right).sum((1, 2)))


def _cross(u: Use, v: Use) -> Tensor:  # [B]
    if isinstance(u, Dense) and isinstance(v, Dense):
        return _f64((u.value * v.value).flatten(1).sum(1))
    if isinstance(u, Dense) or isinstance(v, Dense):
        d, o = (u, v) if isinstance(u, Dense) else (v, u)
        return _dense_outer(d.value, o)
    out = []
    for s in _groups(u.right.shape[0], u.right.shape[1] * v.right.shape[1]):
        right = u.right[s] @ v.right[s].transpose(1, 2)
        out.append(_f64((_left_gram(u.left[s], v.left[s]).to(right.dtype) * right).sum((1, 2))))
    return torch.cat(out)


def _self(u: Use) -> Tensor:  # [B]
    return _f64(u.value).flatten(1).square().sum(1) if isinstance(u, Dense) else _outer_self(u)


# -- the pass ----------------------------------------------------------------------------------------------
def covered_parameters(model: nn.Module) -> dict[int, int]:
    """``id(parameter) -> number of modules that hold it`` for every trainable parameter a rule covers; a
    trainable parameter no rule covers raises :class:`ScoreNormError` naming it."""
    uses: dict[int, int] = {}
    for m in model.modules():
        rule = RULES.get(type(m).__name__, None)
        for p in rule.params(m) if rule is not None else []:
            uses[id(p)] = uses.get(id(p), 0) + 1
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in uses:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            raise ScoreNormError(
                f"per-sequence score norms: parameter {name} ({type(owner).__name__}) has no per-row rule (rules: "
                f"{', '.join(RULES.names())}); freeze it or register a rule in satrl.training.score_rules")
    return uses


@contextlib.contextmanager
def _recording(model: nn.Module, tape: Tape, skip: nn.Module | None = None) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for m in model.modules():
            rule = RULES.get(type(m).__name__, None)
            if rule is None or m is skip:
                continue
            if rule.patch is not None:
                stack.enter_context(rule.patch(m, tape))
            if rule.record is not None:
                def hook(mod, args, out, rule=rule):
                    rec = rule.record(mod, args, out, tape)
                    if rec is not None:
                        tape.records.append(rec)

                stack.callback(m.register_forward_hook(hook).remove)
        yield


@dataclass
class ChunkedHead:
    """The LM head of a chunked log-prob forward (``satrl.training.logprobs``, ``chunk_tokens`` > 0): it runs on
    chunks of the flattened [B, T', H] scoring positions under activation checkpointing, so its output gradient
    is never held for the whole microbatch. Its per-row gradient is rebuilt one row at a time instead, from its
    inputs (kept by a hook) and the analytic gradient of log softmax(logits / temperature)[y] with respect to the
    logits, (e(y_t) - p_t) / temperature on the active tokens: a [T', V] tensor for one row at a time.
    ``ids`` [B, T] the sampled tokens (the forward's first T' columns are used)."""

    module: nn.Module
    ids: Tensor
    temperature: float
    inputs: list[Tensor] = field(default_factory=list)

    @contextlib.contextmanager
    def tap(self) -> Iterator[None]:
        handle = self.module.register_forward_hook(lambda m, args, out: self.inputs.append(args[0].detach()))
        try:
            yield
        finally:
            handle.remove()

    def row_uses(self, b: int, mask: Tensor, dtype: torch.dtype) -> list[tuple[Key, Use]]:
        """Row ``b``'s uses of the head's parameters (its weight; its bias, if it has one)."""
        chunks = [x for x in self.inputs if x.dim() == 2]  # the head on chunks of the flattened [B * T', H]
        if len(self.inputs) > 1:  # (the chunked path also calls the head once as an identity on [B, T', H])
            self.inputs[:] = [torch.cat(chunks)] if chunks else self.inputs[:1]
        hidden = self.inputs[0].reshape(self.ids.shape[0], -1, self.inputs[0].shape[-1])
        width = hidden.shape[1]
        h, ids, active = hidden[b], self.ids[b, :width], mask[b, :width]
        with torch.no_grad():
            p = torch.softmax(self.module(h).float() / self.temperature, dim=-1)
            g = (torch.nn.functional.one_hot(ids, p.shape[-1]).to(p.dtype) - p) / self.temperature
            g = torch.where(active[:, None], g, 0.0).to(dtype)
        w, bias = self.module.weight, getattr(self.module, "bias", None)
        uses = [((id(w), -1), Outer(g[None], h[None].to(dtype), w.shape[0]))] if w.requires_grad else []
        if bias is not None and bias.requires_grad:
            uses.append(((id(bias), -1), Dense(g.sum(0)[None])))
        return uses


def _row(u: Use, b: int) -> Use:
    if isinstance(u, Dense):
        return Dense(u.value[b : b + 1])
    return Outer(u.left[b : b + 1], u.right[b : b + 1], u.rows)


def _add_head(out: dict[str, Tensor], by_key: dict[Key, list[Use]], head: ChunkedHead, mask: Tensor,
              dtype: torch.dtype, names: dict[int, str]) -> None:  # fmt: skip
    """The chunked head's share, row by row: its own norm and its cross terms with the other uses of its
    parameter (the tied embedding)."""
    for b in range(mask.shape[0]):
        for k, use in head.row_uses(b, mask, dtype):
            sq = out.setdefault(names[k[0]], torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device))
            sq[b] += _self(use)[0] + sum((2 * _cross(use, _row(o, b))[0] for o in by_key.get(k, [])), 0.0)


def parameter_score_norms(model: nn.Module, forward: Callable[[], Tensor], mask: Tensor,
                          head: ChunkedHead | None = None) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """As :func:`score_norms`, with the squared norm split by parameter: ``{name: [B] float64}`` (an expert
    parameter's blocks summed; a tied parameter under its first name, its uses' cross terms included).
    ``head``: the forward is the chunked log-prob path, whose LM head is this (:class:`ChunkedHead`)."""
    covered_parameters(model)
    first = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = torch.promote_types(first.dtype if first is not None else torch.float32, torch.float32)
    tape = Tape(rows=mask.shape[0], dtype=dtype)
    tap = head.tap() if head is not None else contextlib.nullcontext()
    # hooks off after the forward: a checkpointed layer's (or log-prob chunk's) recompute adds nothing
    with _recording(model, tape, skip=head.module if head is not None else None), tap:
        logp = forward()
    outputs = [o for r in tape.records for o in r.outputs]
    grads = torch.autograd.grad(torch.where(mask, logp, 0.0).sum(), outputs, allow_unused=True)
    by_key: dict[Key, list[Use]] = {}  # a parameter block used twice (a tied weight, a reused layer): summed
    at = 0
    for rec in tape.records:
        for k, use in rec.build(list(grads[at : at + len(rec.outputs)])):
            by_key.setdefault(k, []).append(use)
        at += len(rec.outputs)
    # Each record's build closure holds the tape that holds the record: a cycle that kept every microbatch's
    # activations alive until a full garbage collection, ~1 GB per step on SmolLM2-135M (issue 57). Break it.
    tape.records.clear()
    del grads, outputs, tape
    names = {id(p): n for n, p in reversed(list(model.named_parameters()))}  # the first name of a tied weight
    out: dict[str, Tensor] = {}
    for (pid, _), uses in by_key.items():
        sq = out.setdefault(names[pid], torch.zeros(mask.shape[0], dtype=torch.float64, device=logp.device))
        for j, use in enumerate(uses):
            sq += _self(use)
            for other in uses[:j]:
                sq += 2 * _cross(use, other)
    if head is not None:
        _add_head(out, by_key, head, mask, dtype, names)
    return logp.detach(), out


def score_norms(model: nn.Module, forward: Callable[[], Tensor], mask: Tensor,
                head: ChunkedHead | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run ``forward()`` (the log-probs [B, T] of ``model``'s sampled tokens, B rows first) with the rules'
    hooks; return ``(logp.detach() [B, T], ||grad_theta sum_t mask * logp||^2 [B] float64)`` from that one
    forward and one backward to the covered modules' outputs (module docstring). ``mask`` [B, T] bool.

    Exact, not approximated: every trainable parameter's per-row gradient is rebuilt (a parameter no rule
    covers raises :class:`ScoreNormError` before the forward). Parameters' ``.grad`` are left untouched."""
    logp, parts = parameter_score_norms(model, forward, mask, head)
    total = torch.zeros(mask.shape[0], dtype=torch.float64, device=logp.device)
    for sq in parts.values():
        total += sq
    return logp, total
