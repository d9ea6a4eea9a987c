"""The advantage baselines: one registry (:data:`ADVANTAGES`), each name with its hyperparameters, what it reads
beyond the rewards (``needs``) and its pure function in :mod:`satrl.training.advantages` (formula and source there).

Chosen by ``train.advantage`` (default ``group_mean``, GRPO's), saved resolved with the run (``{name: rloo}``, or
``{name: constant_offset, c: 0.5}``); ``train.adv_std_norm`` (Dr. GRPO's switch) applies to every one of them.
What a baseline ``needs`` the trainer measures before the batch's first step, at the batch's first weights:

- ``score_norms``: each response's log w_i = sum_t log pi/mu and ||grad log pi(tau_i)||^2 (one forward and one
  backward per microbatch, :meth:`~satrl.training.batch_advantages.Advantages.sequence_scores`): ``opob``, ``opob_unweighted``.
- ``token_probs``: each token's log pi_old(y_t) and sum_v pi_old(v)^2 over the vocabulary (one forward per
  microbatch, no backward; the full [tokens, V] logits, chunked as the step's own when
  ``train.logprob_chunk_tokens`` > 0): ``otb``.

Like the objectives' (:mod:`satrl.objectives.components`), the functions are registered :class:`Deferred`, so a
config is validated without importing torch. Each is ``fn(inp: AdvantageInputs, *, std_norm, **params) -> (adv,
metrics)``, ``adv`` [B] (or [B, T] for a per-token baseline: the loss takes either, :func:`satrl.tensors.clean_adv`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from satrl.objectives.registry import Deferred, Params, component_registry

__all__ = ["ADVANTAGES", "DEFAULT_ADVANTAGE", "ConstantOffset", "OTBParams", "resolve_advantage"]


def _fn(name: str) -> Deferred:
    """The adapter ``name`` of :mod:`satrl.training.advantages` (torch), imported when first called."""

    def load():
        from satrl.training import advantages

        return getattr(advantages, name)

    return Deferred(load)


class ConstantOffset(Params):
    """A baseline a constant below the group mean, floored at the group's worst reward."""

    c: float = Field(0.1, ge=0, le=1e6, description="The offset c >= 0 in reward units: b_g = max(mean_g R - c, "
                     "min_g R), so that responses up to c below the mean still count as better than the baseline; "
                     "0 gives GRPO's group mean.")  # fmt: skip


class OTBParams(Params):
    """verl's optimal token baseline (verl 0.9.1 ``compute_optimal_token_baseline_advantage``)."""

    handle_zero_tail: bool = Field(True, description="Where one response of a group is the longest alone, its tokens "
                                   "past the second longest get baseline 0 (verl's default).")  # fmt: skip
    rollout_is: Literal["none", "token", "sequence"] = Field(
        "none", description="Scale each token's weight by the squared truncated importance weight min(pi_old/mu, "
        "rollout_is_threshold) (verl's rollout correction weights, per token or the sequence's product); none: off.",
    )  # fmt: skip
    rollout_is_threshold: float = Field(
        2.0, gt=0, description="The truncation of rollout_is (verl's default 2.0)."
    )


# fn(inp: AdvantageInputs, *, std_norm, **params) -> (adv [B] or [B, T], 0-dim metrics)
ADVANTAGES = component_registry("advantage baseline")
ADVANTAGES.register("group_mean", _fn("group_mean_rule"))
ADVANTAGES.register("constant_offset", _fn("constant_offset_rule"), params=ConstantOffset)
ADVANTAGES.register("rloo", _fn("rloo_rule"))
ADVANTAGES.register("otb", _fn("otb_rule"), params=OTBParams, needs=("token_probs",))
# VCPO's baseline (satrl.objectives.vcpo), for any objective; the vcpo correction's baseline=opob is the same one
ADVANTAGES.register("opob", _fn("opob_rule"), needs=("score_norms",))
ADVANTAGES.register("opob_unweighted", _fn("opob_unweighted_rule"), needs=("score_norms",))


def resolve_advantage(value: Any) -> Params:
    """``train.advantage`` as typed parameters: a name (``rloo``), a mapping with one (``{name: constant_offset, c:
    0.5}``; ``group_mean`` when it names none) or parameters already resolved. ValueError, one line, naming the
    unknown baseline or key."""
    if isinstance(value, Params):
        value = value.model_dump()
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a baseline's name or a mapping with a name, got {value!r}")
    values = dict(value)
    component = ADVANTAGES.get(values.pop("name", "group_mean"))
    return component.validate(values)


DEFAULT_ADVANTAGE = resolve_advantage("group_mean")  # train.advantage's default: GRPO's group mean
