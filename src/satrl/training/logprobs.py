"""Log-probs of the sampled tokens: the one forward the trainer, its reference and its snapshots run.

Two ways to the same numbers (docs/design.md, "Trainer"):

- **full** (``chunk_tokens=0``): the model's own forward gives logits at every position, [B, L, V]; the scoring
  positions are gathered, temperature-scaled and ``log_softmax``-ed in fp32. Simple, and what an unmodified
  causal LM computes; on a 150k vocabulary at 16k tokens it holds several fp32 [N, V] tensors at once.
- **chunked** (``chunk_tokens > 0``): the decoder runs without its LM head; a pre-hook on the final norm keeps
  only the scoring positions (so the norm and everything after it see [B, T, H], not [B, L, H]); then the LM
  head, the temperature and the ``log_softmax`` run on ``chunk_tokens`` rows at a time, each chunk under
  activation checkpointing, so that its [chunk, V] logits are recomputed in the backward instead of saved.
  Peak extra memory: a few [chunk, V] fp32 tensors. It assumes ``logits = lm_head(norm(h))`` (Llama / Qwen
  family: ``model.get_decoder().norm`` and ``model.get_output_embeddings()``); on CPU fp32 it equals the full
  path bit for bit on the shipped models (tests/training/test_logprobs.py).

Neither path reads a device value on the host when the caller passes ``length`` and ``padded`` (computed from
the CPU batch): the attention mask is then prepared here (:func:`attention_arg`): none at all without padding (the causal
kernel, as transformers would pick after checking the mask on the host), else transformers' own 4-D mask.
No KV cache is built (``use_cache=False``): a training forward never reads one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from satrl.tensors import scoring_positions
from satrl.types import Batch


@functools.cache
def _takes_mask_mapping(decoder_cls: type) -> bool:
    """Whether a transformers decoder accepts a prepared ``{layer type: mask}`` mapping as its attention mask
    (Llama / Qwen2 / Qwen3 do: ``isinstance(attention_mask, dict)`` in their forward; Qwen3-MoE does not)."""
    try:
        return "isinstance(causal_mask_mapping := attention_mask, dict)" in inspect.getsource(decoder_cls.forward)
    except (OSError, TypeError):
        return False


def attention_arg(model: torch.nn.Module, attention_mask: torch.Tensor, padded: bool | None):
    """The ``attention_mask`` argument for a forward over ``attention_mask``'s [B, L] columns.

    ``padded=None`` (unknown), or a model with sliding-window layers: the 2-D mask, which transformers
    inspects on the host. Padded rows:
    transformers' own SDPA mask, causal AND key not padding, as a [B, 1, L, L] bool tensor built on the device
    (transformers passes a 4-D mask through unchecked). No padding: the prepared mapping ``{"full_attention":
    None}`` (pure causal attention, the kernel transformers would pick after looking at the mask on the host),
    where the decoder takes one; else the 2-D mask (one host check)."""
    config = getattr(model, "config", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    sliding = layer_types != {"full_attention"} or getattr(config, "sliding_window", None) is not None
    if padded is None or sliding:  # sliding-window attention needs transformers' own masks
        return attention_mask.long()
    if padded:
        L = attention_mask.shape[1]
        idx = torch.arange(L, device=attention_mask.device)
        causal = idx[None, :] <= idx[:, None]  # [q, kv]
        return causal[None, None] & attention_mask.bool()[:, None, None, :]
    get_decoder = getattr(model, "get_decoder", None)
    if _takes_mask_mapping(type(get_decoder() if get_decoder is not None else model)):
        return {"full_attention": None}
    return attention_mask.long()


def _token_logp(head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = head(hidden).float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[:, None]).squeeze(-1)


@functools.cache
def _compiled_token_logp() -> Callable:
    """``_token_logp`` through torch.compile (``train.compile``), built once, on first use."""
    return torch.compile(_token_logp, dynamic=True)


# The chunk "auto" picks: the most rows whose fp32 [rows, vocab] logits take at most this many bytes (a power of
# two, 2048 for Qwen3's 151,936 tokens: 1.2 GiB; the backward holds about three such tensors at once).
AUTO_CHUNK_BYTES = 2 << 30


def vocab_size(model: torch.nn.Module) -> int:
    """The LM head's output size (the model's config where it has none)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def chunk_for_vocab(vocab: int) -> int:
    """``logprob_chunk_tokens=auto``: the largest power of two of rows whose fp32 logits fit AUTO_CHUNK_BYTES
    (at least 16 rows)."""
    rows = max(16, AUTO_CHUNK_BYTES // (4 * max(vocab, 1)))
    return 1 << (rows.bit_length() - 1)


def resolve_chunk_tokens(chunk_tokens: int | str, model: torch.nn.Module) -> int:
    """``train.logprob_chunk_tokens`` as the number the trainer uses: ``auto`` from the model's vocabulary."""
    if chunk_tokens == "auto":
        return chunk_for_vocab(vocab_size(model))
    if not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise ValueError(f"logprob_chunk_tokens must be an int >= 0 or 'auto', got {chunk_tokens!r}")
    return chunk_tokens


def full_logits_bytes(rows: int, length: int, width: int, vocab: int, dtype: torch.dtype) -> int:
    """An estimate of the full path's (``chunk_tokens=0``) vocabulary-sized tensors for one microbatch: the
    model's logits [rows, length, V] in the compute dtype and their gradient, and four fp32 [rows, width, V]
    (the gathered logits, scaled, their log-softmax, and its gradient). A floor: the decoder's own is extra."""
    item = torch.finfo(dtype).bits // 8
    return rows * vocab * (2 * length * item + 4 * width * 4)


def chunked_token_logp(
    head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_tokens: int,
    compiled: bool = False,
) -> torch.Tensor:  # fmt: skip
    """log softmax(head(hidden) / temperature)[ids] for hidden [B, T, H], ids [B, T], ``chunk_tokens`` rows of
    B*T at a time; under autograd each chunk is checkpointed (its logits are recomputed in the backward)."""
    B, T, H = hidden.shape
    flat, flat_ids = hidden.reshape(B * T, H), ids.reshape(B * T)
    grad = torch.is_grad_enabled() and hidden.requires_grad
    fn = _compiled_token_logp() if compiled else _token_logp
    pieces = []
    for s in range(0, B * T, chunk_tokens):
        h, i = flat[s : s + chunk_tokens], flat_ids[s : s + chunk_tokens]
        if grad:
            pieces.append(checkpoint(fn, head, h, i, temperature, use_reentrant=False))
        else:
            pieces.append(fn(head, h, i, temperature))
    return torch.cat(pieces).reshape(B, T)


def _scoring_hidden(model: torch.nn.Module, ids, mask, pos: torch.Tensor) -> torch.Tensor:
    """The final norm's output at the scoring positions only, [B, T, H]: the model's own forward with its LM
    head passed through. Through the root forward, not the decoder's, so that a wrapper of the whole model
    (FSDP2 under data parallel, which gathers the embeddings, the norm and the head there) sees the call."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()

    def keep_scoring_positions(_norm: torch.nn.Module, args: tuple) -> tuple:
        h = args[0]
        return (h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1])), *args[1:])

    handle = decoder.norm.register_forward_pre_hook(keep_scoring_positions)
    head.forward = lambda h: h  # for this call only: the chunks apply the head (an instance attribute, deleted below)
    try:
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    finally:
        handle.remove()
        del head.forward


def response_logp(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    routing: torch.Tensor | None = None,  # [B, L, layers, top_k] to replay (R3), or None
    capture: bool = False,
    *,
    length: int | None = None,  # the longest row's length, from the CPU batch (None: read it here, a host sync)
    padded: bool | None = None,  # whether any row is shorter than ``length`` (None: let transformers look)
    chunk_tokens: int = 0,  # 0: the full-logits path; > 0: the chunked path (module docstring)
    width: int | None = None,  # the microbatch's longest response, from the CPU batch (None: the batch's T)
    compiled: bool = False,  # the chunk's head and log-softmax through torch.compile (chunked path only)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(y_t | s_t) of each response token [B, T], from temperature-scaled logits (the engine's
    sampler), and, if ``capture``, the experts each MoE layer used at the scoring positions [B, T, layers, k].

    With ``width`` < T the LM head and the log-softmax run on the first ``width`` response positions only (the
    microbatch's own longest response, not the batch's) and the result is zero-padded back to [B, T]: the
    positions cut are past every row's end, masked out wherever they are read."""
    L, full_T, T, pos, ids, mask = _scoring_inputs(model, mb, length, padded, width)
    with contextlib.ExitStack() as stack:
        if routing is not None:
            from satrl.models.routing import replay_routing

            stack.enter_context(replay_routing(model, routing[:, :L]))
        rec = None
        if capture:
            from satrl.models.routing import capture_routing

            rec = stack.enter_context(capture_routing(model))  # inside replay: records the experts used
        if chunk_tokens > 0:
            hidden = _scoring_hidden(model, ids, mask, pos)
        else:
            out = model(input_ids=ids, attention_mask=mask, use_cache=False)
        used = None
        if rec is not None:
            r = rec.take()
            used = _pad_to(r.gather(1, pos[:, :, None, None].expand(-1, -1, *r.shape[2:])), full_T)
    resp = mb.response_ids[:, :T]
    if chunk_tokens > 0:
        logp = chunked_token_logp(model.get_output_embeddings(), hidden, resp, temperature, chunk_tokens, compiled)
        return _pad_to(logp, full_T), used
    logits = out.logits.gather(1, pos[..., None].expand(-1, -1, out.logits.shape[-1])).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return _pad_to(logp.gather(-1, resp[..., None]).squeeze(-1), full_T), used


def _scoring_inputs(model: torch.nn.Module, mb: Batch, length: int | None, padded: bool | None, width: int | None):
    """What :func:`response_logp` and :func:`response_probs` score: the rows' length L (``length``, or the
    microbatch's longest row), the full response width T, the width scored (``width`` capped to [1, T]), the
    scoring positions [B, T'], and the input ids and attention argument cut to L."""
    L = int(mb.attention_mask.sum(1).max()) if length is None else length
    full_T = mb.mask.shape[1]
    T = full_T if width is None else max(1, min(width, full_T))
    pos = scoring_positions(mb.prompt_len, T, L)  # [B, T]
    return L, full_T, T, pos, mb.input_ids[:, :L], attention_arg(model, mb.attention_mask[:, :L], padded)


@torch.no_grad()
def response_probs(
    model: torch.nn.Module, mb: Batch, temperature: float, routing: torch.Tensor | None = None, *,
    length: int | None = None, padded: bool | None = None, chunk_tokens: int = 0, width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(log pi(y_t | s_t), sum_v pi(v | s_t)^2), each [B, T] fp32, from the temperature-scaled logits, no graph:
    the inputs of the optimal token baseline (:func:`satrl.training.advantages.optimal_token_baseline`).

    sum_v pi(v)^2 = exp(logsumexp_v 2 log pi(v)), verl's ``calculate_sum_pi_squared_from_logits`` in log space. It
    needs every position's full [V] distribution: a forward without backward, whose [rows, V] fp32 logits are
    taken ``chunk_tokens`` rows at a time as :func:`response_logp`'s chunked path (all at once with 0). Arguments
    as :func:`response_logp`'s."""
    L, full_T, T, pos, ids, mask = _scoring_inputs(model, mb, length, padded, width)
    with contextlib.ExitStack() as stack:
        if routing is not None:
            from satrl.models.routing import replay_routing

            stack.enter_context(replay_routing(model, routing[:, :L]))
        if chunk_tokens > 0:
            hidden, head = _scoring_hidden(model, ids, mask, pos), model.get_output_embeddings()
        else:
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            hidden, head = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])), torch.nn.Identity()
    B = hidden.shape[0]
    flat, flat_ids = hidden.reshape(B * T, hidden.shape[-1]), mb.response_ids[:, :T].reshape(B * T)
    logp, sq = torch.zeros(B * T, device=hidden.device), torch.zeros(B * T, device=hidden.device)
    step = chunk_tokens if chunk_tokens > 0 else max(B * T, 1)
    for s in range(0, B * T, step):
        lsm = torch.log_softmax(head(flat[s : s + step]).float() / temperature, dim=-1)
        logp[s : s + step] = lsm.gather(-1, flat_ids[s : s + step, None]).squeeze(-1)
        sq[s : s + step] = torch.logsumexp(2 * lsm, dim=-1).exp()
    return _pad_to(logp.reshape(B, T), full_T), _pad_to(sq.reshape(B, T), full_T)


def _pad_to(x: torch.Tensor, T: int) -> torch.Tensor:
    """``x`` [B, W, ...] zero-padded along dim 1 to [B, T, ...] (itself when W == T)."""
    if x.shape[1] == T:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], T - x.shape[1], *x.shape[2:]))], dim=1)
