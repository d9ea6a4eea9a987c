"""SAT through verl's real actor loss path: ``verl.workers.utils.losses.ppo_loss`` on the micro-batches of
verl's own splitter ``verl.workers.engine.utils.prepare_micro_batches``.

The harness does what verl 0.9's engine does for one actor mini-batch on one rank
(``RayPPOTrainer._update_actor`` -> ``FSDPEngine.forward_backward_batch``): left/right-padded batch ->
``left_right_2_no_padding``, the global token count and dp size as non-tensor data, micro-batches by
``micro_batch_size_per_gpu`` or, with ``use_dynamic_bsz``, by ``max_token_len_per_gpu``; then for each
micro-batch the model's packed log-probs go through ``ppo_loss`` and ``backward``. Only the model is
replaced: its log-probs are a leaf tensor, so the accumulated gradient can be compared exactly.

Skips without verl; ``make test-verl`` (SATRL_REQUIRE_VERL=1) runs it in the environment built with
``pip install '.[verl]'``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from run_helpers import Extra
from satrl.objectives import policy_loss

with Extra("verl") as verl_extra:
    from tensordict import TensorDict
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    import satrl.integrations.verl as sv
    from satrl.integrations import _gate
VERL_MISSING = verl_extra.missing


pytestmark = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))

B, P, T = 16, 5, 12  # sequences per mini-batch, prompt and response widths


@pytest.fixture(autouse=True)
def _one_thread_and_fresh_warning():
    torch.set_num_threads(1)
    _gate._warned_gate.clear()
    yield
    _gate._warned_gate.clear()


def rollout(seed: int, equal_lengths: bool = False, drift: float = 0.1, noise: float = 0.02):
    """A padded mini-batch as verl's trainer holds it (left-padded prompts, right-padded responses) and the
    policy's response log-probs [B, T] (the model output, a leaf). Per-sequence drift: GSPO-stale."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, P + 1, (B,), generator=g)
    resp_len = torch.full((B,), T) if equal_lengths else torch.randint(3, T + 1, (B,), generator=g)
    cols = torch.arange(P + T)
    attention_mask = ((cols >= P - prompt_len[:, None]) & (cols < P + resp_len[:, None])).long()
    response_mask = attention_mask[:, P:]
    input_ids = torch.randint(1, 50, (B, P + T), generator=g) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    old = torch.randn(B, T, generator=g) * 0.5 - 1.5
    logp = old + torch.randn(B, 1, generator=g) * drift + torch.randn(B, T, generator=g) * noise
    adv = torch.randn(B, 1, generator=g).expand(B, T).clone()
    data = {
        "prompts": input_ids[:, :P], "responses": input_ids[:, P:], "input_ids": input_ids,
        "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask,
        "old_log_probs": old * response_mask, "advantages": adv * response_mask, "row": torch.arange(B),
    }
    return data, (logp * response_mask).requires_grad_()


def model_output(logp: torch.Tensor, mb: TensorDict) -> dict:
    """The packed log-probs a model returns for micro-batch ``mb``: per sequence, prompt + response valid
    positions, where position j holds log p(token j + 1) (so response token k sits at prompt_len + k - 1)."""
    rows, attn = mb["row"], mb["attention_mask"]
    pieces = []
    for i, row in enumerate(rows.tolist()):
        n_prompt, n_resp = int(attn[i, :P].sum()), int(attn[i, P:].sum())
        pieces.append(torch.cat([logp.new_zeros(n_prompt - 1), logp[row, :n_resp], logp.new_zeros(1)]))
    return {"log_probs": torch.nested.as_nested_tensor(pieces, layout=torch.jagged)}


def actor_config(loss_mode: str, agg: str = "token-mean", **sat_keys) -> ActorConfig:
    sat_keys.setdefault("sat_mu", "rollout")  # the harness's old_log_probs play the engine's (bypass mode)
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=4, clip_ratio_low=0.2, clip_ratio_high=0.28,
        loss_agg_mode=agg, policy_loss=sv.SatPolicyLossConfig(loss_mode=loss_mode, **sat_keys),
    )


def actor_step(config: ActorConfig, data: dict, logp: torch.Tensor, micro_batch_size: int | None = None,
               max_token_len: int | None = None):
    """One mini-batch through verl's splitter and ``ppo_loss``: (d sum-of-losses / d logp, micro-batches'
    rows, per-micro-batch metrics)."""
    td = left_right_2_no_padding(TensorDict({k: v.clone() for k, v in data.items()}, batch_size=[B]))
    dynamic = max_token_len is not None
    tu.assign_non_tensor(td, global_batch_size=B, use_dynamic_bsz=dynamic,
                         **({"max_token_len_per_gpu": max_token_len} if dynamic
                            else {"micro_batch_size_per_gpu": micro_batch_size}))
    # FSDPEngine.forward_backward_batch: global token count (all-reduced over dp) and the dp size
    tu.assign_non_tensor(td, batch_num_tokens=int(td["loss_mask"].sum()), dp_size=1)
    micro_batches, _ = prepare_micro_batches(data=td, dp_group=None, same_micro_num_in_dp=True)
    logp.grad = None
    rows, metrics = [], []
    for mb in micro_batches:
        loss, m = ppo_loss(config, model_output(logp, mb), mb)
        loss.backward()
        rows.append(mb["row"].tolist())
        metrics.append({k: v.aggregate() if hasattr(v, "aggregate") else v for k, v in m.items()})
    return logp.grad.clone(), rows, metrics


def satrl_gradient(name: str, data: dict, logp: torch.Tensor, rows: list[list[int]], agg: str, alpha: float):
    """satrl.objectives on each of verl's micro-batches, normalized over the mini-batch as verl's agg_loss."""
    v = sv.VARIANTS[name]
    leaf = logp.detach().clone().requires_grad_()
    mask = data["response_mask"].bool()
    total = int(mask.sum())
    for r in rows:
        idx = torch.tensor(r)
        loss_tok, _, _ = policy_loss(
            v.preset, logp=leaf[idx], behavior_logp=data["old_log_probs"][idx], adv=data["advantages"][idx],
            mask=mask[idx], eps_low=0.2, eps_high=0.28, dual_clip=None if v.per_sequence else 3.0, alpha=alpha,
        )
        core_algos.agg_loss(loss_tok, mask[idx], agg, dp_size=1, batch_num_tokens=total,
                            global_batch_size=B).backward()
    return leaf.grad


@pytest.mark.parametrize("ours,theirs", [("sat", "vanilla"), ("sat_gspo", "gspo")])
@pytest.mark.parametrize("split", [{"micro_batch_size": 4}, {"max_token_len": 40}])
def test_actor_gate_off_equals_verls_own_loss(ours, theirs, split):
    """sat_alpha = 1 through ppo_loss and verl's micro-batching: verl's vanilla / gspo gradient, bit for bit."""
    data, logp = rollout(0)
    agg = "seq-mean-token-mean" if ours == "sat_gspo" else "token-mean"
    grad, rows, metrics = actor_step(actor_config(ours, agg, sat_alpha=1.0), data, logp, **split)
    ref_grad, ref_rows, _ = actor_step(actor_config(theirs, agg), data, logp, **split)
    assert rows == ref_rows and len(rows) > 1
    assert torch.equal(grad, ref_grad) and grad.abs().sum() > 0
    assert all(m["actor/sat_gate_rate_microbatch_mean"] == 0.0 for m in metrics)


@pytest.mark.parametrize("name,agg", [("sat", "token-mean"), ("sat_gspo", "seq-mean-token-mean"),
                                      ("sat_gspo", "token-mean")])
@pytest.mark.parametrize("split", [{"micro_batch_size": 8}, {"max_token_len": 100}])
def test_actor_gate_on_is_satrl_per_micro_batch(name, agg, split):
    """sat_alpha = 0.8: the accumulated gradient is satrl's objective on each of verl's micro-batches (the
    quantile is per micro-batch), normalized over the mini-batch, bit for bit; the gate acts (the gradient
    is not the base loss's)."""
    data, logp = rollout(5)
    grad, rows, metrics = actor_step(actor_config(name, agg, sat_alpha=0.8), data, logp, **split)
    assert sorted(sum(rows, [])) == list(range(B)) and len(rows) > 1
    assert torch.equal(grad, satrl_gradient(name, data, logp, rows, agg, alpha=0.8))
    assert any(m["actor/sat_gate_rate_microbatch_mean"] > 0 for m in metrics)
    base, _, _ = actor_step(actor_config("gspo" if name == "sat_gspo" else "vanilla", agg), data, logp, **split)
    assert not torch.equal(grad, base)


def test_sequence_gate_is_inert_at_small_micro_batches_and_warns_once():
    """Four equal-length sequences per micro-batch: alpha = 0.9 allows 10 % of the tokens, less than one
    sequence, so sat_gspo is gspo (gate rate 0, one warning per process). One micro-batch holding the whole
    mini-batch (dynamic batching, a token budget above its size) is satrl's objective on the mini-batch, the
    paper's semantics with the minibatch as SAT's microbatch, and the gate fires."""
    data, logp = rollout(5, equal_lengths=True)
    agg = "seq-mean-token-mean"
    with pytest.warns(RuntimeWarning, match=r"gates at most n - ceil\(alpha\*n\) = 4 of its n = 48 tokens"):
        grad, rows, metrics = actor_step(actor_config("sat_gspo", agg), data, logp, micro_batch_size=4)
    assert len(rows) == 4 and all(m["actor/sat_gate_rate_microbatch_mean"] == 0.0 for m in metrics)
    ref_grad, _, _ = actor_step(actor_config("gspo", agg), data, logp, micro_batch_size=4)
    assert torch.equal(grad, ref_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # already warned in this process: silent now
        actor_step(actor_config("sat_gspo", agg), data, logp, micro_batch_size=4)
        _gate._warned_gate.clear()
        whole, rows, metrics = actor_step(actor_config("sat_gspo", agg), data, logp, max_token_len=10_000)
    assert len(rows) == 1 and sorted(rows[0]) == list(range(B))
    assert metrics[0]["actor/sat_gate_rate_microbatch_mean"] > 0  # at most 1 of 16 sequences: 1/16 = 0.0625 of the tokens
    assert torch.equal(whole, satrl_gradient("sat_gspo", data, logp, rows, agg, alpha=0.9))
    assert not torch.equal(whole, grad)  # same data, same loss_mode: the split decides SAT's gradient


def test_prob_diff_gate_is_token_level_and_does_not_warn():
    data, logp = rollout(3, equal_lengths=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actor_step(actor_config("sat_gspo_prob_diff", "seq-mean-token-mean"), data, logp, micro_batch_size=4)


def test_ppo_kl_is_clamped_like_vanillas():
    """A token with |d| > 20 (e.g. a -inf-ish old log-prob) moves ppo_kl exactly as much as in vanilla."""
    data, logp = rollout(4)
    data["old_log_probs"][0, 0] = -60.0
    _, _, metrics = actor_step(actor_config("sat", sat_alpha=0.8), data, logp, micro_batch_size=16)
    _, _, ref = actor_step(actor_config("vanilla"), data, logp, micro_batch_size=16)
    assert ref[0]["actor/ppo_kl"] < -0.1  # the clamp at 20 bounds this token's share: 20 / n
    assert metrics[0]["actor/ppo_kl"] == pytest.approx(ref[0]["actor/ppo_kl"], rel=1e-6)
