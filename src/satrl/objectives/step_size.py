"""The step-size seam: how an objective changes the trainer's learning rate, and its advantage baseline.

Adam(W) divides each update by a running RMS of the gradients, so multiplying the loss by a factor barely moves
the step: a method that wants a smaller step on an unreliable batch (VCPO's ESS rule) has to scale the learning
rate. An objective component declares such a rule as a trait, and the trainer applies it to one optimizer step:

- ``traits={"step_size": make}``: ``make(**params)`` gets the component's hyperparameters and returns a
  :data:`StepSizeRule` (or None where those hyperparameters switch it off). The rule is a pure function of
  detached tensors, :class:`StepInputs` -> :class:`StepSize` (a 0-dim scale > 0 and 0-dim metrics). The trainer
  calls it after a step's microbatch loop, on every token of the minibatch (gathered across data-parallel ranks,
  so every rank computes the same scale), sets each parameter group's ``lr`` to ``base_lr * scale`` for that
  ``opt.step()`` only and puts ``base_lr`` back, so checkpoints and the optimizer state never see the scale.
  Several rules multiply; ``train.lr_lag_scaling`` (:func:`lag_step_scale`) multiplies in too.
- ``traits={"advantage": make}``: ``make(**params)`` returns an :data:`AdvantageRule` (or None) that replaces
  GRPO's group-mean baseline: ``rule(rewards, group_index, log_w, score_sq, std_norm) -> (adv [B], metrics)``,
  with each sequence's log importance weight and squared score-gradient norm, which the trainer measures with one
  forward and backward per sequence at the start of the batch (VCPO's OPOB).

With no component declaring a trait and ``train.lr_lag_scaling=none`` the trainer runs exactly as before: no rule
is evaluated and the learning rate is never touched. :func:`step_size_rules` and :func:`advantage_rule` read the
traits off a resolved objective (so nothing downstream compares a component's name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "LAG_SCALINGS",
    "AdvantageRule",
    "StepInputs",
    "StepSize",
    "StepSizeRule",
    "advantage_rule",
    "lag_step_scale",
    "step_scales",
    "step_size_rules",
]


@dataclass(frozen=True)
class StepInputs:
    """What a step-size rule sees: one minibatch's tokens, detached. All [B, T]."""

    d: Tensor  # log pi_theta - log mu per token at the step's forward (0 on masked positions)
    mask: Tensor  # bool, active response tokens
    lag: Tensor  # trainer version - the token's version (>= 0)


class StepSize(NamedTuple):
    """A rule's verdict: the learning-rate multiplier (0-dim, float64, > 0) and 0-dim metrics (logged ``obj/*``)."""

    scale: Tensor
    metrics: dict[str, Tensor]


StepSizeRule = Callable[[StepInputs], StepSize]
# rule(rewards [B], group_index [B], log_w [B], score_sq [B], std_norm) -> (adv [B], 0-dim metrics)
AdvantageRule = Callable[[Tensor, Tensor, Tensor, Tensor, bool], tuple[Tensor, dict[str, Tensor]]]


def _chosen(spec: Any, trait: str) -> list[Callable[..., Any]]:
    """Each chosen component's ``trait`` factory applied to its hyperparameters; the Nones left out. (Read through
    the spec, :meth:`~satrl.objectives.presets.ObjectiveSpec.components`: this module, which VCPO's rules import,
    imports neither the presets nor the registries.)"""
    out = []
    for component, params in spec.components():
        make = component.traits.get(trait)
        if make is not None and (rule := make(**params.kwargs())) is not None:
            out.append(rule)
    return out


def step_size_rules(spec: Any) -> list[StepSizeRule]:
    """The step-size rules a resolved :class:`~satrl.objectives.ObjectiveSpec`'s components declare (often none)."""
    return _chosen(spec, "step_size")


def advantage_rule(spec: Any) -> AdvantageRule | None:
    """The advantage baseline a resolved objective's components declare, or None (GRPO's group mean)."""
    rules = _chosen(spec, "advantage")
    if len(rules) > 1:
        raise ValueError("objective: more than one component declares an advantage baseline; choose one")
    return rules[0] if rules else None


# ---------------------------------------------------------------------------------------- lag scaling
LAG_SCALINGS = ("none", "inverse", "inverse_sqrt")


@torch.no_grad()
def lag_step_scale(lag: Tensor, mask: Tensor, rule: str) -> tuple[Tensor, Tensor]:
    """The learning-rate multiplier of ``train.lr_lag_scaling``: 1/S (``inverse``) or 1/sqrt(S) (``inverse_sqrt``).

    S is the minibatch's realized lag: the mean of ``lag`` over active tokens, clamped to at least 1, so that a
    synchronous batch (lag 0) and a one-step-stale one (lag 1) keep the base rate. The stale-gradient bias grows as
    O(S * lr) (arXiv 2607.01083), which these rules hold constant (inverse) or halve in growth (inverse_sqrt).

    Args: ``lag`` [B, T] (>= 0), ``mask`` [B, T] bool, ``rule`` one of :data:`LAG_SCALINGS` other than none.
    Returns: ``(scale, S)``, both 0-dim float64.
    """
    active = mask.to(torch.float64)
    n = active.sum().clamp(min=1.0)
    S = ((lag.to(torch.float64) * active).sum() / n).clamp(min=1.0)
    if rule == "inverse":
        return 1.0 / S, S
    if rule == "inverse_sqrt":
        return S.rsqrt(), S
    raise ValueError(f"lr_lag_scaling must be one of {list(LAG_SCALINGS[1:])} here, got {rule!r}")


def step_scales(rules: list[StepSizeRule], lag_scaling: str, inp: StepInputs) -> dict[str, Tensor]:
    """One step's lr multiplier ``train/lr_scale`` (0-dim float64, on the tokens' device) and its factors: the
    objective's ``rules`` (``obj/step_scale`` and their metrics) times ``train.lr_lag_scaling``'s
    (``train/lag_lr_scale`` at realized lag ``train/lr_lag``). A pure function of the minibatch's detached tokens
    ``inp`` (gathered across data-parallel ranks: the same numbers on every rank)."""
    out: dict[str, Tensor] = {}
    device = inp.mask.device
    scale = torch.ones((), dtype=torch.float64, device=device)
    if rules:
        obj = torch.ones((), dtype=torch.float64, device=device)
        for rule in rules:
            s, metrics = rule(inp)
            obj = obj * s
            out.update({f"obj/{k}": v.to(torch.float64) for k, v in metrics.items()})
        out["obj/step_scale"] = obj
        scale = scale * obj
    if lag_scaling != "none":
        s, S = lag_step_scale(inp.lag, inp.mask, lag_scaling)
        out["train/lag_lr_scale"], out["train/lr_lag"] = s, S
        scale = scale * s
    out["train/lr_scale"] = scale
    return out
