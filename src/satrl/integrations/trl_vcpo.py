"""VCPO in TRL's ``GRPOTrainer``: ``VCPOGRPOTrainer(args=VCPOGRPOConfig(...))`` (extra ``trl``).

VCPO (:mod:`satrl.objectives.vcpo`; Huang et al. 2026, arXiv 2602.17616) has two variance controls for stale
rollouts, neither of which changes TRL's per-token loss (every ``loss_type``, clip and KL stays TRL's own):

1. **ESS step size, on the optimizer** (Adam(W) would cancel a scaled loss). Over the completions of one
   optimizer step, i.e. the rows of every loss call (micro-batch) of one gradient-accumulation window,
   ``per_device_train_batch_size * gradient_accumulation_steps`` completions per process, **gathered across
   processes** (so every process applies the same scale)::

       log w_i = sum_t (log pi_theta(y_it) - log mu(y_it))    pi_theta: TRL's log-probs at that loss call's forward

   the step scale is :func:`~satrl.objectives.vcpo.ess_step_scale` (rule ``sqrt``/``linear``, base ratio, weight
   cap; ``vcpo_ess_step=False`` logs the ESS but leaves the lr alone). HF's ``on_pre_optimizer_step`` callback
   multiplies each param group's ``lr`` by it right before ``self.optimizer.step()`` and ``on_optimizer_step``
   puts the base lr back right after, as satrl's own trainer does, so the LR scheduler, the optimizer's state dict
   and checkpoints only see the base lr. With ``num_iterations > 1`` a completion counts in each window that
   trains on it, at that window's weights.
2. **OPOB baseline** (``vcpo_baseline="opob"``). At generation time (the model is pi_old), per prompt group g::

       W_i = w_i^2 ||grad_theta log pi(tau_i)||^2,   log w_i = sum_t (log pi_old(y_it) - log mu(y_it))
       shift_g = b_g - mean_g R = sum_g W_i (R_i - mean_g R) / sum_g W_i     (satrl.objectives.vcpo.opob_shift)
       advantage_i = (R_i - mean_g R - shift_g) / (std + 1e-4)                (TRL's own centring and scaling)

   with TRL's reward sum, group mean (``nanmean``), ``scale_rewards`` (group, batch or none: its ``nanstd``) and
   epsilon 1e-4, over the rewards of all processes, each process keeping its own slice. The trainer first checks
   that this recomputation gives TRL's own advantages bit for bit (else it raises: an unsupported TRL). Unscorable
   completions (NaN reward) stay out of the baseline and keep advantage 0, as in TRL. ``opob_unweighted`` takes
   every w_i = 1 (W_i is the score norm alone); ``group_mean`` keeps TRL's advantages and skips the score pass.

The score norms take one extra forward and one backward of the policy over the generation batch's completions
(chunks of ``per_device_train_batch_size`` rows), :func:`satrl.training.score_norms.score_norms`: batched, to the
layers' outputs only (no ``.grad`` is touched). Its forward is the model's own (unfused) forward with TRL's
temperature, not TRL's ``_get_per_token_logps_and_entropies``: that one projects through the LM head inside a fused
autograd function (``trl.trainer.utils.add_fused_lm_head``) that no module hook sees, so the LM head's (and a tied
embedding's) share of each norm would be dropped. Same log-probs and gradients (tested per row against TRL's fused
path, within 1e-5 in fp32; under TRL's default bf16 autocast the two round apart by about 0.5 %). pi_old in log w
is TRL's ``old_per_token_logps`` when the batch has them, else this forward's log-probs.

mu is chosen by ``VCPOGRPOTrainer(..., mu_source=...)`` exactly as :class:`~satrl.integrations.trl.SATGRPOTrainer`
chooses SAT's (``auto``: vLLM's or a ``rollout_func``'s sampling log-probs when the batch has them, else TRL's old
policy; logged as ``vcpo/mu_source``, 1 sampling, 0 old policy). Without sampling log-probs w_i = 1 at generation,
and W_i is the score norm alone.

Metrics in TRL's logs, named as satrl's trainer names them: ``obj/ess_ratio``, ``obj/ess``, ``train/lr_scale`` (per
optimizer step) and ``obj/opob_shift`` (per generation batch: the mean over sequences of |b_g - mean_g R|).
Not covered: DeepSpeed (its engine steps the optimizer), multimodal inputs and
``multi_objective_aggregation="normalize_then_sum"`` with the OPOB baselines (refused), evaluation (advantages
unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError
from torch import Tensor

try:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"satrl.integrations.trl_vcpo needs TRL ({exc}); install it with `pip install '.[trl]'` "
                      "in a clone of satrl") from exc

from satrl.integrations.trl import check_mu_source, choose_mu
from satrl.integrations.trl_baselines import replace_advantages
from satrl.objectives.params import VCPOParams
from satrl.objectives.registry import one_line
from satrl.objectives.vcpo import ess_step_scale, opob_shift, sequence_log_weights
from satrl.training.score_norms import score_norms

MULTIMODAL_KEYS = ("pixel_values", "token_type_ids", "mm_token_type_ids", "image_position_ids")
WHO = "VCPOGRPOTrainer"
MODULE = "satrl.integrations.trl_vcpo"
F64 = torch.float64


@dataclass
class VCPOGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus VCPO's keys (``satrl.objectives.params.VCPOParams``, same ranges and defaults).

    Args:
        vcpo_ess_rule: lr multiplier sqrt(min(1, rho / rho_0)) (``sqrt``, VCPO's) or min(1, rho / rho_0) (``linear``),
            rho = ESS / B over one optimizer step's completions.
        vcpo_ess_base_ratio: rho_0 in (0, 1]: the ESS ratio at and above which the lr is unscaled.
        vcpo_ess_weight_cap: C > 0: ESS over min(w_i, C); None: uncapped (VCPO's recipes).
        vcpo_ess_step: control 1 on (VCPO) or off (the base lr on every step; the ESS is still logged).
        vcpo_baseline: ``opob`` (VCPO's off-policy optimal baseline), ``opob_unweighted`` (the same with w_i = 1)
            or ``group_mean`` (TRL's advantages).
    """

    vcpo_ess_rule: str = field(default="sqrt", metadata={"help": "VCPO's ESS lr rule: sqrt or linear."})
    vcpo_ess_base_ratio: float = field(default=1.0, metadata={"help": "ESS/B at and above which the lr is unscaled."})
    vcpo_ess_weight_cap: float | None = field(default=None, metadata={"help": "Cap C on w_i inside ESS (None: off)."})
    vcpo_ess_step: bool = field(default=True, metadata={"help": "Scale the lr by the ESS rule (False: log only)."})
    vcpo_baseline: str = field(default="opob", metadata={"help": "Baseline: opob, opob_unweighted or group_mean."})

    def __post_init__(self):
        super().__post_init__()
        try:
            VCPOParams.model_validate({"name": "vcpo", **self.vcpo_step_kwargs(), "ess_step": self.vcpo_ess_step,
                                       "baseline": self.vcpo_baseline})
        except ValidationError as err:
            raise ValueError(one_line(err, "VCPOGRPOConfig.vcpo_")) from None
        if self.vcpo_baseline != "group_mean" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(f"VCPOGRPOConfig: vcpo_baseline={self.vcpo_baseline!r} needs multi_objective_aggregation="
                             f"'sum_then_normalize' (got {self.multi_objective_aggregation!r}): OPOB shifts the group "
                             "baseline of one summed reward; use vcpo_baseline='group_mean'")

    def vcpo_step_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~satrl.objectives.vcpo.ess_step_scale`."""
        return {"ess_rule": self.vcpo_ess_rule, "ess_base_ratio": self.vcpo_ess_base_ratio,
                "ess_weight_cap": self.vcpo_ess_weight_cap}


class _StepScale(TrainerCallback):
    """HF's hooks around ``self.optimizer.step()``: open the window's row buffer, scale the lr, restore it."""

    def __init__(self, trainer: VCPOGRPOTrainer):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kwargs):  # a new gradient-accumulation window
        self.trainer._vcpo_rows.clear()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._vcpo_scale_lr()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._vcpo_restore_lr()


class VCPOGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with VCPO's ESS step size and OPOB baseline (module docstring). Needs ``args=VCPOGRPOConfig``.

    Args:
        mu_source: VCPO's mu: ``"auto"`` (default), ``"sampling"`` or ``"old_policy"``, as ``SATGRPOTrainer``'s.
    """

    def __init__(self, *args: Any, mu_source: str = "auto", **kwargs: Any):
        check_mu_source(mu_source, args, kwargs, WHO)  # before TRL loads the model
        self.mu_source = mu_source
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, VCPOGRPOConfig):
            raise TypeError(f"{WHO} needs args=VCPOGRPOConfig(...), got {type(self.args).__name__}")
        self._vcpo_rows: list[Tensor] = []  # per loss call of the open window: [rows, 2] (log w, has a token)
        self._vcpo_inputs: dict | None = None  # the loss call whose log-probs the hook reads
        self._vcpo_rewards: Tensor | None = None  # this generation's rewards_per_func, all processes
        self._vcpo_base_lrs: list | None = None
        self.add_callback(_StepScale(self))

    # -- ESS step size -----------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        self._vcpo_inputs = inputs if self.model.training else None  # read (and cleared) by the hook below
        try:
            loss = super()._compute_loss(model, inputs)
            if self._vcpo_inputs is not None:  # the hook never ran: the step would be scaled on no rows
                raise RuntimeError("TRL's _compute_loss did not call _get_per_token_logps_and_entropies; this TRL "
                                   "version is not supported by satrl.integrations.trl_vcpo (pip install '.[trl]' "
                                   "in a clone of satrl)")
            return loss
        finally:
            self._vcpo_inputs = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._vcpo_inputs is not None:  # the policy forward of _compute_loss (not generation's)
            inputs, self._vcpo_inputs = self._vcpo_inputs, None
            self._vcpo_record(out[0], inputs)
        return out

    @torch.no_grad()
    def _vcpo_record(self, per_token_logps: Tensor, inputs: dict) -> None:
        """Keep this loss call's log w_i = sum_t (log pi_theta - log mu) and whether row i has a token."""
        mask = _loss_mask(inputs)
        logp = per_token_logps.detach()
        mu, source = choose_mu(self.mu_source, logp, inputs, WHO)
        log_w = sequence_log_weights(logp - mu, mask)
        self._vcpo_rows.append(torch.stack([log_w, mask.any(1).to(F64)], 1))
        self._metrics["train"]["vcpo/mu_source"].append(source.value)

    @torch.no_grad()
    def _vcpo_scale_lr(self) -> None:
        """Each param group's lr times the window's ESS scale (rows of all processes), until ``_vcpo_restore_lr``."""
        dev = self.accelerator.device
        rows = torch.cat(self._vcpo_rows).to(dev) if self._vcpo_rows else torch.zeros((0, 2), dtype=F64, device=dev)
        self._vcpo_rows.clear()
        rows = self.accelerator.gather(self.accelerator.pad_across_processes(rows, dim=0))  # padded rows: no token
        step = ess_step_scale(rows[:, :1], rows[:, 1:].bool(), **self.args.vcpo_step_kwargs())
        scale = float(step.scale) if self.args.vcpo_ess_step else 1.0
        groups = self.optimizer.param_groups
        self._vcpo_base_lrs = [g["lr"] for g in groups]
        for g, lr in zip(groups, self._vcpo_base_lrs):
            g["lr"] = lr * scale
        logged = self._metrics["train"]
        logged["obj/ess"].append(float(step.metrics["ess"]))
        logged["obj/ess_ratio"].append(float(step.metrics["ess_ratio"]))
        logged["train/lr_scale"].append(scale)

    def _vcpo_restore_lr(self) -> None:
        if self._vcpo_base_lrs is not None:
            for g, lr in zip(self.optimizer.param_groups, self._vcpo_base_lrs):
                g["lr"] = lr
            self._vcpo_base_lrs = None

    # -- OPOB baseline -----------------------------------------------------------------------------------
    def _calculate_rewards(self, *args: Any, **kwargs: Any):
        out = super()._calculate_rewards(*args, **kwargs)
        self._vcpo_rewards = out
        return out

    def _generate_and_score_completions(self, inputs):
        self._vcpo_rewards = None
        try:
            out = super()._generate_and_score_completions(inputs)
            if self.model.training and self.args.vcpo_baseline != "group_mean":
                self._vcpo_opob(out)
            return out
        finally:
            self._vcpo_rewards = None

    @torch.no_grad()
    def _vcpo_opob(self, out: dict) -> None:
        """Replace ``out["advantages"]`` by TRL's centring and scaling of R - shift_g (module docstring, 2)."""
        if self._vcpo_rewards is None:  # checked before the score pass, as replace_advantages would
            raise RuntimeError("TRL's _generate_and_score_completions did not call _calculate_rewards; this TRL "
                               f"version is not supported by {MODULE}")
        log_w, score_sq = self._vcpo_sequence_scores(out)  # this process's rows
        if self.args.vcpo_baseline == "opob_unweighted":
            log_w = torch.zeros_like(log_w)
        scores = self.accelerator.gather(torch.stack([log_w, score_sq], 1).to(self._vcpo_rewards.device))  # [N, 2]
        shifts: list[Tensor] = []

        def centre(rewards: Tensor, group: Tensor, centred: Tensor, valid: Tensor) -> Tensor:
            shift = torch.zeros(rewards.numel(), dtype=F64, device=rewards.device)
            shift[valid] = opob_shift(rewards[valid], group[valid], scores[valid, 0], scores[valid, 1])
            shifts.append(shift[valid])
            return centred - shift.to(centred.dtype)

        replace_advantages(self, out, self._vcpo_rewards, centre, MODULE)
        shift = shifts[0]
        self._metrics["train"]["obj/opob_shift"].append(float(shift.abs().mean()) if shift.numel() else 0.0)

    def _vcpo_sequence_scores(self, out: dict) -> tuple[Tensor, Tensor]:
        """This process's log w_i = sum_t (log pi_old - log mu) and ||grad log pi(tau_i)||^2 ([n] float64 each),
        from one batched forward and backward per ``per_device_train_batch_size`` rows (module docstring)."""
        if any(k in out for k in MULTIMODAL_KEYS):
            raise ValueError(f"{WHO}: vcpo_baseline={self.args.vcpo_baseline!r} does not support multimodal inputs "
                             "(no per-row score rule for the vision tower's forward here); use "
                             "vcpo_baseline='group_mean'")
        prompt, completion = out["prompt_ids"], out["completion_ids"]
        ids = torch.cat([prompt, completion], 1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        mask = _loss_mask(out)
        step = self.args.per_device_train_batch_size
        logps, sqs = [], []
        with torch.enable_grad():
            for s in range(0, ids.size(0), step):
                rows = slice(s, s + step)
                def forward(r=rows):
                    return self._vcpo_score_logps(ids[r], attn[r], completion[r])

                logp, sq = score_norms(self.model, forward, mask[rows])
                logps.append(logp)
                sqs.append(sq)
        old = out.get("old_per_token_logps")
        old = torch.cat(logps) if old is None else old
        mu, _ = choose_mu(self.mu_source, old, out, WHO)
        return sequence_log_weights(old - mu, mask), torch.cat(sqs)

    def _vcpo_score_logps(self, input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor) -> Tensor:
        """log pi of the completion tokens [B, K] through the model's unfused forward (hooks see the LM head)."""
        K = completion_ids.size(1)
        with self.accelerator.autocast():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                logits_to_keep=K + 1).logits[:, :-1]
        logp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def _loss_mask(inputs: dict) -> Tensor:  # [B, T] bool: TRL's loss mask (completion, times the tool mask)
    mask = inputs["completion_mask"]
    return (mask * inputs["tool_mask"] if "tool_mask" in inputs else mask).bool()


__all__ = ["VCPOGRPOConfig", "VCPOGRPOTrainer"]
