"""satrl's advantage baselines in TRL's ``GRPOTrainer`` (extra ``trl``): ``BaselineGRPOTrainer(args=
BaselineGRPOConfig(advantage="constant_offset", advantage_c=0.5))``, or with SAT's clip interval
``SATBaselineGRPOTrainer(args=SATBaselineGRPOConfig(...))``; the mixins (:class:`BaselineArgs`,
:class:`BaselineMixin`) put the same two keys on any ``GRPOConfig`` / ``GRPOTrainer`` subclass.

What each of satrl's baselines (:data:`satrl.training.baselines.ADVANTAGES`) is in TRL is decided in one place,
:data:`IN_TRL`: ``group_mean`` is TRL's own advantages, left untouched; ``constant_offset`` is computed by satrl's
registered function (:func:`satrl.training.advantages.constant_offset_advantages`, b_g = max(mean_g R - c, min_g R))
and replaces TRL's; ``rloo`` TRL already has (``trl.RLOOTrainer``; in ``GRPOTrainer``, with TRL's fixed group size
n, rloo's advantage is n/(n-1) times the group mean's), ``otb`` needs each token's pi_old and sum_v pi_old(v)^2 from
the logits, which GRPOTrainer's fused LM head (``add_fused_lm_head``) is not asked for, and the OPOB baselines are
:mod:`satrl.integrations.trl_vcpo`'s: all three are refused, in one line, naming the way.

The advantage, per completion i of prompt group g (TRL's ``sum_then_normalize`` reward R, NaN where unscorable)::

    A_i = (R_i - b_i) / (std + 1e-4)       R_i - b_i: satrl's function with std_norm=False, over the scorable rows

``scale_rewards`` plays the part of satrl's ``train.adv_std_norm``, with TRL's own std: ``group`` divides by the
group's std (TRL's ``nanstd``, Bessel-corrected; satrl's trainer divides by the population std + 1e-6), ``batch``
by the batch's, ``none`` (Dr. GRPO) not at all. Unscorable completions keep advantage 0, as in TRL.

**Several processes.** TRL gathers every process's rewards (``_calculate_rewards``), computes the advantages of the
whole generation batch on every process, and each keeps its own slice. The plug-in does the same: satrl's function
runs on every process over all processes' rewards (groups are TRL's consecutive ``num_generations`` rows of the
gathered batch, so a group split across processes is still one group), and each process keeps its slice, so the
advantages are those of one process holding the whole batch. Before replacing TRL's advantages the trainer checks
that its recomputation of TRL's (R - mean_g R, TRL's scaling) gives TRL's own slice bit for bit, and raises if a
TRL version computes them otherwise. Evaluation keeps TRL's advantages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"satrl.integrations.trl_baselines needs TRL ({exc}); install it with `pip install '.[trl]'` "
                      "in a clone of satrl") from exc

from satrl.integrations.trl import SATGRPOConfig, SATGRPOTrainer
from satrl.objectives.registry import Params
from satrl.training.advantages import AdvantageInputs
from satrl.training.baselines import ADVANTAGES

WHO = "satrl.integrations.trl_baselines"
TRL_ADV_EPS = 1e-4  # TRL's epsilon in (R - mean) / (std + eps), GRPOTrainer._generate_and_score_completions


class InTRL(NamedTuple):
    """What one of satrl's baselines is in TRL's ``GRPOTrainer``."""

    satrl_computes: bool  # satrl's function replaces TRL's advantages (else TRL's own stay)
    refused: str = ""  # why the plug-in does not offer it, and what to use instead


IN_TRL: dict[str, InTRL] = {  # every name of satrl.training.baselines.ADVANTAGES (tested)
    "group_mean": InTRL(False),
    "constant_offset": InTRL(True),
    "rloo": InTRL(False, "TRL has RLOO: trl.RLOOTrainer; in GRPOTrainer, with TRL's fixed group size n, rloo's "
                  "advantage is n/(n-1) times group_mean's (the same direction)"),
    "otb": InTRL(False, "OTB needs each token's pi_old and sum_v pi_old(v)^2, which GRPOTrainer's fused LM head does "
                 "not return (docs/integrations.md, 'Advantage baselines in TRL'); use satrl's trainer "
                 "(train.advantage=otb)"),
    "opob": InTRL(False, "OPOB is VCPO's baseline: satrl.integrations.trl_vcpo.VCPOGRPOTrainer(vcpo_baseline='opob')"),
    "opob_unweighted": InTRL(False, "use satrl.integrations.trl_vcpo.VCPOGRPOTrainer(vcpo_baseline="
                             "'opob_unweighted')"),
}


# -- TRL's own centring and scaling, recomputed (shared with satrl.integrations.trl_vcpo) ------------------------
def trl_centring(rewards_per_func: Tensor, reward_weights: Tensor, group_size: int,
                 scale_rewards: str) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """TRL's (``sum_then_normalize``) summed reward R [N] (NaN: unscorable), R - group mean and the std of
    ``scale_rewards`` [N], over all processes' rows ``rewards_per_func`` [N, F]."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    G = group_size
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:  # group, or none (TRL then uses std only for its zero-std metric)
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0) if G > 1 else torch.zeros_like(rewards)
    return rewards, rewards - mean, std


def trl_scaled(centred: Tensor, std: Tensor, scale_rewards: str) -> Tensor:
    """TRL's advantage from a centred reward: / (std + 1e-4) unless ``scale_rewards='none'``; NaN -> 0."""
    adv = centred if scale_rewards == "none" else centred / (std + TRL_ADV_EPS)
    return torch.nan_to_num(adv, nan=0.0)


# (R [N], NaN where unscorable; groups [N]; TRL's R - mean_g R [N]; scorable [N] bool) -> the new R - b [N], over
# the scorable rows (the others' values are dropped: their advantage is 0, as in TRL)
Centre = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@torch.no_grad()
def replace_advantages(trainer: GRPOTrainer, out: dict, rewards_per_func: Tensor | None, centre: Centre,
                       who: str) -> Tensor:  # fmt: skip
    """Replace ``out["advantages"]`` (this process's slice) by TRL's scaling of ``centre``'s R - b, computed over
    every process's rows, after checking that TRL's own advantages are what :func:`trl_centring` says; returns the
    new advantages of all processes [N] (and puts them in TRL's completions table). ``who``: the plug-in's module,
    for the messages."""
    if rewards_per_func is None:
        raise RuntimeError(f"TRL's _generate_and_score_completions did not call _calculate_rewards; this TRL version "
                           f"is not supported by {who}")
    scale = trainer.scale_rewards
    rewards, centred, std = trl_centring(rewards_per_func, trainer.reward_weights, trainer.num_generations, scale)
    n = out["advantages"].numel()
    local = slice(trainer.accelerator.process_index * n, (trainer.accelerator.process_index + 1) * n)
    if not torch.equal(trl_scaled(centred, std, scale)[local], out["advantages"]):
        raise RuntimeError("TRL's advantages are not (R - group mean) / (std + 1e-4) per scale_rewards as satrl "
                           f"recomputes them; this TRL version is not supported by {who}")
    valid = ~torch.isnan(rewards)  # unscorable completions: out of the baseline, advantage 0 as in TRL
    group = torch.arange(rewards.numel(), device=rewards.device) // trainer.num_generations
    new = torch.where(valid, centre(rewards, group, centred, valid), torch.nan)
    adv = trl_scaled(new, std, scale)
    out["advantages"] = adv[local]
    logged, values = trainer._logs["advantages"], adv.tolist()  # TRL's completions table: the advantages used
    for k in range(1, min(len(values), len(logged)) + 1):
        logged[-k] = values[-k]
    return adv


# -- the config keys and the trainer -----------------------------------------------------------------------------
@dataclass
class BaselineArgs:
    """The advantage baseline's keys, for a ``GRPOConfig`` subclass (``class C(BaselineArgs, GRPOConfig)``).

    Args:
        advantage: one of satrl's baselines that :data:`IN_TRL` offers: ``group_mean`` (TRL's advantages) or
            ``constant_offset``.
        advantage_c: ``constant_offset``'s c >= 0 in reward units (None: satrl's default, 0.1; saved resolved).
    """

    advantage: str = field(default="group_mean", metadata={"help": "satrl's advantage baseline: group_mean (TRL's "
                           "own) or constant_offset (b = max(group mean - c, group min))."})  # fmt: skip
    advantage_c: float | None = field(default=None, metadata={"help": "constant_offset's c >= 0, in reward units "
                                      "(None: satrl's default)."})  # fmt: skip

    def __post_init__(self):
        super().__post_init__()
        who = type(self).__name__
        try:
            ADVANTAGES.get(self.advantage)
        except ValueError as err:
            raise ValueError(f"{who}.advantage: {err}") from None
        route = IN_TRL[self.advantage]
        if route.refused:
            raise ValueError(f"{who}.advantage={self.advantage!r} is not offered in TRL: {route.refused}")
        try:
            params = self.advantage_params()
        except ValueError as err:
            raise ValueError(f"{who}.advantage_c: {err}") from None
        self.advantage_c = params.kwargs().get("c")  # resolved: TRL saves the config with the run
        if route.satrl_computes and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(f"{who}: advantage={self.advantage!r} needs multi_objective_aggregation="
                             f"'sum_then_normalize' (got {self.multi_objective_aggregation!r}): the baseline is of one "
                             "summed reward; use advantage='group_mean'")

    def advantage_params(self) -> Params:
        """The baseline's typed parameters (satrl's validation: ValueError, one line, naming the key)."""
        values = {} if self.advantage_c is None else {"c": self.advantage_c}
        return ADVANTAGES.get(self.advantage).validate(values)


class BaselineMixin:
    """Puts ``args.advantage``'s baseline into TRL's advantages (module docstring); before a ``GRPOTrainer`` subclass
    in the bases, with ``args`` a :class:`BaselineArgs` config."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, BaselineArgs):
            raise TypeError(f"{type(self).__name__} needs args with satrl's BaselineArgs (e.g. BaselineGRPOConfig), "
                            f"got {type(self.args).__name__}")
        self._baseline_rewards: Tensor | None = None  # this generation's rewards_per_func, all processes

    def _calculate_rewards(self, *args: Any, **kwargs: Any):
        out = super()._calculate_rewards(*args, **kwargs)
        self._baseline_rewards = out
        return out

    def _generate_and_score_completions(self, inputs):
        self._baseline_rewards = None
        try:
            out = super()._generate_and_score_completions(inputs)
            if self.model.training and IN_TRL[self.args.advantage].satrl_computes:
                replace_advantages(self, out, self._baseline_rewards, self._baseline_centre, WHO)
            return out
        finally:
            self._baseline_rewards = None

    def _baseline_centre(self, rewards: Tensor, group: Tensor, centred: Tensor, valid: Tensor) -> Tensor:
        """R - b of ``args.advantage`` by satrl's registered function (std_norm=False: TRL scales), scorable rows."""
        params = self.args.advantage_params()
        # the rewards-only baselines (no `needs`, the only ones IN_TRL offers) read no tokens: an empty [M, 0] mask
        empty = torch.zeros((int(valid.sum()), 0), device=rewards.device)
        inp = AdvantageInputs(rewards[valid], group[valid], empty.bool(), empty)
        new = torch.zeros_like(centred)
        new[valid] = ADVANTAGES.get(params.name).fn(inp, std_norm=False, **params.kwargs())[0].to(centred.dtype)
        return new


@dataclass
class BaselineGRPOConfig(BaselineArgs, GRPOConfig):
    """TRL's ``GRPOConfig`` plus ``advantage`` / ``advantage_c`` (:class:`BaselineArgs`)."""


class BaselineGRPOTrainer(BaselineMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with satrl's advantage baseline (module docstring). Needs ``args=BaselineGRPOConfig``."""


@dataclass
class SATBaselineGRPOConfig(BaselineArgs, SATGRPOConfig):
    """``SATGRPOConfig`` (SAT's keys) plus ``advantage`` / ``advantage_c``."""


class SATBaselineGRPOTrainer(BaselineMixin, SATGRPOTrainer):
    """``SATGRPOTrainer`` (SAT's clip interval) with satrl's advantage baseline; ``args=SATBaselineGRPOConfig``."""

__all__ = ["IN_TRL", "BaselineArgs", "BaselineGRPOConfig", "BaselineGRPOTrainer", "BaselineMixin", "InTRL",
           "SATBaselineGRPOConfig", "SATBaselineGRPOTrainer", "replace_advantages", "trl_centring", "trl_scaled"]
