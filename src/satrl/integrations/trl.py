"""SAT in TRL's ``GRPOTrainer``: ``SATGRPOTrainer(args=SATGRPOConfig(...))`` (extra ``trl``).

TRL picks its loss inside ``GRPOTrainer._compute_loss`` and documents subclassing as the way to change
it. Its clipped losses (``loss_type`` grpo, bnpo, dr_grpo, dapo, luspo) all compute

    coef_1 = exp(log w)          # log w = log pi - log pi_old: per token [B, T], or the sequence mean [B, 1]
    coef_2 = clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
    per_token_loss = -min(coef_1 * A, coef_2 * A)

SAT (paper Eqs. 13-17) replaces the fixed interval by per-token bounds [1 - eps_low c-, 1 + eps_high c+]. So
the subclass changes the interval (and, with an engine mu, the ratio's denominator: below): for the duration
of each ``_compute_loss`` call, right after TRL has computed the policy's log-probs, it sets
``self.epsilon_low`` / ``self.epsilon_high`` to SAT's per-token radii (tensors, [B, T] at token level, [B, 1]
at sequence level) from :func:`satrl.objectives.sat.sat_clip_bounds`. Everything else (log-probs, KL,
importance sampling, aggregation per ``loss_type``, gradient accumulation, TRL's clip metrics, which then
count SAT's contracted interval) is TRL's own code. The gate ranks

- ``importance_sampling_level="token"``: |d_t| with d_t = log pi - log mu (satrl preset ``sat_grpo``);
- ``importance_sampling_level="sequence"`` (GSPO): |mean_t d_t| of the sequence, length-weighted
  (satrl preset ``sat_gspo``);

or, with ``sat_proxy="prob_diff"`` (token level only), |pi - mu| of each token, where d = log pi - log mu.

mu, SAT's behaviour policy, is chosen by ``SATGRPOTrainer(..., mu_source=...)`` and logged as
``sat/mu_source`` (1 = the generator's sampling log-probs, 0 = TRL's old policy):

- ``"auto"`` (default): TRL's ``sampling_per_token_logps`` when the batch has them (TRL keeps the log-probs
  vLLM, or a ``rollout_func``, returned for the sampled tokens), else the old policy. The engine's
  log-probs are the paper's mu; TRL's OPSM makes the same choice.
- ``"sampling"``: the sampling log-probs; refused when the trainer is built if neither vLLM
  (``use_vllm=True``) nor a ``rollout_func`` generates, and an error when a batch has none.
- ``"old_policy"``: TRL's ``old_per_token_logps`` (the policy at generation time, recomputed by the trainer,
  when ``num_iterations > 1``, ``steps_per_generation > gradient_accumulation_steps`` or vLLM importance
  sampling is on; else TRL uses ``per_token_logps.detach()``, d = 0 and the gate never fires).

Which ratio SAT clips:

- mu = the engine's log-probs: verl's bypass mode. For the call, the subclass sets (in a copy of TRL's
  inputs) ``old_per_token_logps`` to mu, so TRL's ratio ``coef_1`` is pi / mu itself, and TRL's vLLM
  importance-sampling weight pi_old / mu is dropped (the ratio already corrects for mu, and verl's bypass
  PPO-clip applies no IS weight either); its mask modes (``token_mask``, ``sequence_mask``) still reject what
  they reject. The per-token loss is then satrl's ``policy_loss("sat_grpo" | "sat_gspo", logp=pi,
  behavior_logp=mu)`` (tested bit for bit at token level). This is also TRL's ratio in every iteration when
  ``num_iterations > 1``, and its KL's ``use_bias_correction_kl`` weight. A token whose sampling log-prob is
  not finite (vLLM maps NaN to None) uses pi_old there (``per_token_logps.detach()`` when TRL has no pi_old).
- mu = TRL's old policy: TRL's ratio pi / pi_old, unchanged. It is identically 1 when no optimizer step
  falls between a batch's generation and its last use (TRL's defaults: ``num_iterations=1``,
  ``steps_per_generation`` = ``gradient_accumulation_steps``); SAT's interval still contains 1, so SAT changes
  nothing, and the trainer says so once, when it is built (``RuntimeWarning``, :func:`ratio_is_one`).

Exactness: the radii are stored as eps' = 1 - lo and eps'' = hi - 1, so TRL's ``1 - eps'`` and ``1 + eps''``
give back exactly lo and hi (Sterbenz: exact for lo in [0.5, 1] and hi in [1, 2], hence ``epsilon <= 0.5`` and
``epsilon_high <= 1``, checked). With ``sat_alpha=1`` the gate is empty, the bounds are exactly TRL's, and
loss and gradients equal ``GRPOTrainer``'s bit for bit (tested; with an engine mu, those of ``GRPOTrainer``
given mu as ``old_per_token_logps``).

SAT's diagnostics reach TRL's logs as ``sat/q``, ``sat/gate_rate``, ``sat/eps_low_mean``,
``sat/eps_high_mean``, ``sat/c_min`` (paper Table 10), averaged over processes. The quantile is over one
loss call: ``per_device_train_batch_size`` completions on one process; the trainer warns once per
process when that call's composition rules the gate out (see ``satrl.integrations._gate``).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"satrl.integrations.trl needs TRL ({exc}); install it with `pip install '.[trl]'` in a clone of satrl") from exc

from satrl.integrations._gate import composition, gate_capacity, warn_gate_cannot_fire
from satrl.integrations._mu import MuSource
from satrl.objectives import ObjectiveInputs, resolve_objective
from satrl.objectives.sat import LAG_FREE_PROXIES, sat_clip_bounds, sat_score

# TRL loss types that clip coef_1 to [1 - epsilon_low, 1 + epsilon_high]: the ones SAT can contract.
SAT_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
TRL_PROXIES = LAG_FREE_PROXIES  # TRL passes no per-token lags (no version_age)
SAT_LOG_KEYS = ("q", "gate_rate", "eps_low_mean", "eps_high_mean", "c_min")  # logged as sat/<key>
TRL_HINT = "raise per_device_train_batch_size (more completions per loss call) or lower sat_alpha"
MU_SOURCES = ("auto", "sampling", "old_policy")  # SATGRPOTrainer(mu_source=...), see the module docstring
IS_MASK_MODES = ("token_mask", "sequence_mask")  # TRL's vLLM IS modes that reject (weight 0), not truncate


@dataclass
class SATGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus SAT's keys; ``epsilon``/``epsilon_high`` are SAT's base radii.

    Args:
        sat_alpha: quantile level alpha of SAT's gate (paper Eq. 14); 1.0 turns the gate off.
        sat_exponent: kernel exponent p of psi(u; q) = 1 / (1 + (u/q)^p) (paper Eq. 16).
        sat_proxy: gate score, ``log_ratio`` (|d|, the paper) or ``prob_diff`` (|pi - mu| per token).
        sat_invert: gate the bottom tail instead of the top (falsification control).
    """

    sat_alpha: float = field(default=0.9, metadata={"help": "SAT gate quantile level alpha (1.0: gate off)."})
    sat_exponent: float = field(default=2.0, metadata={"help": "SAT kernel exponent p (> 0)."})
    sat_proxy: str = field(default="log_ratio", metadata={"help": "SAT gate score: log_ratio or prob_diff."})
    sat_invert: bool = field(default=False, metadata={"help": "Gate the bottom tail (falsification control)."})

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in SAT_LOSS_TYPES:
            raise ValueError(f"SATGRPOConfig.loss_type={self.loss_type!r} has no clip interval for SAT to "
                             f"contract; choose one of {list(SAT_LOSS_TYPES)}")
        if self.sat_proxy not in TRL_PROXIES:
            raise ValueError(f"SATGRPOConfig.sat_proxy={self.sat_proxy!r}; choose one of {list(TRL_PROXIES)}")
        if self.sat_proxy == "prob_diff" and self.importance_sampling_level == "sequence":
            # Per-token bounds on TRL's [B, 1] sequence ratio would spread each token's clip over the whole
            # sequence through the mean (satrl's sat_gspo keeps it on the token): not the same objective.
            raise ValueError("SATGRPOConfig.sat_proxy='prob_diff' needs importance_sampling_level='token' "
                             "(at sequence level the gate ranks sequences: use sat_proxy='log_ratio')")
        eps_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if not (0.0 <= self.epsilon <= 0.5 and 0.0 <= eps_high <= 1.0):
            raise ValueError(f"SATGRPOConfig: epsilon={self.epsilon} must be in [0, 0.5] and epsilon_high="
                             f"{eps_high} in [0, 1] (SAT's bounds are handed to TRL exactly only there)")
        # satrl's own checks (alpha in [0, 1], exponent > 0), with satrl's messages
        resolve_objective("sat_grpo", eps_low=self.epsilon, eps_high=eps_high, alpha=self.sat_alpha,
                          exponent=self.sat_exponent, proxy=self.sat_proxy, invert=self.sat_invert)


def check_mu_source(mu_source: str, args: tuple, kwargs: dict, who: str = "SATGRPOTrainer") -> None:
    """Refuse an unknown ``mu_source``, and ``"sampling"`` when TRL will generate without log-probs, before the
    model loads (``who``: the trainer class, for the message; shared with ``satrl.integrations.trl_vcpo``).

    TRL keeps ``sampling_per_token_logps`` only when vLLM (``use_vllm=True``) or a ``rollout_func``
    generates; its own generation (transformers, plain or continuous batching) returns none, and every loss
    call would then fail. Arguments that do not bind to ``GRPOTrainer``'s signature are left to TRL.
    """
    if mu_source not in MU_SOURCES:
        raise ValueError(f"{who}(mu_source={mu_source!r}); choose one of {list(MU_SOURCES)}")
    if mu_source != "sampling":
        return
    try:
        bound = inspect.signature(GRPOTrainer.__init__).bind_partial(None, *args, **kwargs).arguments
    except TypeError:
        return
    config, rollout_func = bound.get("args"), bound.get("rollout_func")
    if rollout_func is None and not getattr(config, "use_vllm", False):
        raise ValueError(f"{who}(mu_source='sampling') needs the generator's sampling log-probs, which TRL "
                         "keeps only when vLLM (use_vllm=True) or a rollout_func generates; this configuration "
                         "generates with transformers: set use_vllm=True, pass a rollout_func, or use "
                         "mu_source='auto' or 'old_policy'")


def ratio_is_one(args: GRPOConfig, num_iterations: int) -> bool:
    """Whether TRL's ratio pi / pi_old is 1 at every loss call: no optimizer step between a batch's generation
    and its last use. TRL's own test in ``_generate_and_score_completions``, where it then skips pi_old."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * num_iterations) == 0


def warn_if_ratio_is_one(args: GRPOConfig, num_iterations: int) -> None:
    """Warn (once, when the trainer is built) that SAT will not act: mu is TRL's old policy and pi/pi_old == 1."""
    if ratio_is_one(args, num_iterations):
        warnings.warn(
            "satrl SATGRPOTrainer: SAT will not act: mu is TRL's old policy (no use_vllm=True or rollout_func "
            f"sampling log-probs, or mu_source='old_policy') and with num_iterations={num_iterations}, "
            f"steps_per_generation={args.steps_per_generation}, gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} every loss call trains at the weights that generated its batch, "
            "so TRL's ratio pi/pi_old is 1 and SAT's interval, which contains 1, changes nothing; generate with "
            "use_vllm=True or a rollout_func (mu = their sampling log-probs) or set num_iterations > 1 "
            "(docs/integrations.md)",
            RuntimeWarning,
            stacklevel=3,
        )


def choose_mu(mu_source: str, logp: Tensor, inputs: dict, who: str = "SATGRPOTrainer") -> tuple[Tensor, MuSource]:
    """mu [B, T] for one batch of TRL's inputs and where it came from (the module docstring's ``mu_source``):
    TRL's ``sampling_per_token_logps`` (a non-finite token falls back to pi_old) or ``old_per_token_logps``,
    whose absence means pi_old = ``logp`` (TRL's own fallback in ``_compute_loss``)."""
    old = inputs.get("old_per_token_logps")
    old = logp if old is None else old
    sampling = inputs.get("sampling_per_token_logps")
    if mu_source == "sampling" and sampling is None:
        raise RuntimeError(f"{who}(mu_source='sampling'): this batch has no sampling log-probs "
                           "(TRL keeps them when vLLM or a rollout_func generates); use mu_source='auto' or "
                           "'old_policy'")
    if sampling is None or mu_source == "old_policy":
        return old, MuSource.OLD_POLICY
    return torch.where(torch.isfinite(sampling), sampling, old), MuSource.ENGINE


class SATGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose clip interval is SAT's (see the module docstring). Needs ``args=SATGRPOConfig``.

    Args:
        mu_source: SAT's mu: ``"auto"`` (default; the sampling log-probs when TRL has them, else the old
            policy), ``"sampling"`` or ``"old_policy"``. Logged as ``sat/mu_source`` (1 sampling, 0 old policy).
    """

    def __init__(self, *args: Any, mu_source: str = "auto", **kwargs: Any):
        check_mu_source(mu_source, args, kwargs)  # before TRL loads the model: a typo costs nothing
        self.mu_source = mu_source
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SATGRPOConfig):
            raise TypeError(f"SATGRPOTrainer needs args=SATGRPOConfig(...), got {type(self.args).__name__}")
        self._sat_base = (self.epsilon_low, self.epsilon_high)  # TRL's scalars, restored after each call
        self._sat_inputs: dict | None = None
        if self.mu_source == "old_policy" or not (self.use_vllm or self.rollout_func is not None):
            warn_if_ratio_is_one(self.args, self.num_iterations)

    def _compute_loss(self, model, inputs):
        # A shallow copy: with an engine mu the hook rewrites the ratio's denominator in it, and TRL reuses
        # the caller's batch (num_iterations > 1), which must keep its own old_per_token_logps.
        inputs = dict(inputs)
        self._sat_inputs = inputs  # read (and cleared) by the log-prob hook below, once
        try:
            loss = super()._compute_loss(model, inputs)
            if self._sat_inputs is not None:  # the hook never ran: SAT would silently not apply
                raise RuntimeError("TRL's _compute_loss did not call _get_per_token_logps_and_entropies; this "
                                   "TRL version is not supported by satrl.integrations.trl (pip install '.[trl]' in a clone of satrl)")
            return loss
        finally:
            self._sat_inputs = None
            self.epsilon_low, self.epsilon_high = self._sat_base

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._sat_inputs is not None:  # the policy forward of _compute_loss (not generation's)
            inputs, self._sat_inputs = self._sat_inputs, None
            mu, source = self._sat_mu(out[0].detach(), inputs)
            if source is MuSource.ENGINE:
                self._sat_bypass(inputs, mu)
            self.epsilon_low, self.epsilon_high = self._sat_radii(out[0], inputs, mu, source)
        return out

    def _sat_bypass(self, inputs: dict, mu: Tensor) -> None:
        """verl's bypass mode in this call's ``inputs``: TRL's ratio becomes pi / mu (``old_per_token_logps``
        := mu), and TRL's vLLM importance-sampling weight pi_old / mu is dropped (the ratio already corrects
        for mu; verl's bypass PPO-clip applies no IS weight either), keeping only what its mask modes reject."""
        inputs["old_per_token_logps"] = mu
        weight = inputs.get("importance_sampling_ratio")
        if weight is None or not (self.use_vllm and self.vllm_importance_sampling_correction):
            return
        if self.vllm_importance_sampling_mode in IS_MASK_MODES:
            inputs["importance_sampling_ratio"] = (weight != 0).to(weight.dtype)
        else:
            inputs["importance_sampling_ratio"] = torch.ones_like(weight)

    @torch.no_grad()
    def _sat_radii(self, per_token_logps: Tensor, inputs: dict, mu: Tensor,
                   source: MuSource) -> tuple[Tensor, Tensor]:
        """SAT's radii (1 - lo, hi - 1) for this call from TRL's log-probs, inputs and mu; logs SAT's metrics."""
        a = self.args
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:  # as TRL's _compute_loss
            mask = mask * inputs["tool_mask"]
        logp = per_token_logps.detach()
        log_ratio = logp - mu
        sequence = self.importance_sampling_level == "sequence"
        if sequence:  # TRL's sequence log-weight, broadcast: the gate ranks sequences, length-weighted
            d = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(log_ratio)
        else:
            d = log_ratio
        active = mask.bool()
        # prob_diff is token level (the config refuses it at sequence level)
        score = sat_score(a.sat_proxy, ObjectiveInputs(logp=logp, denom_logp=mu, behavior_logp=mu,
                                                       old_logp=mu, mask=active))  # fmt: skip
        eps_low, eps_high = self._sat_base
        lo, hi, m, _ = sat_clip_bounds(d, active, eps_low=eps_low, eps_high=eps_high, alpha=a.sat_alpha,
                                    exponent=a.sat_exponent, invert=a.sat_invert, score=score)
        per_sequence = sequence
        if per_sequence:  # one bound per sequence, TRL's [B, 1] shape (so its gradient path is unchanged)
            lo, hi = lo[:, :1], hi[:, :1]
        self._sat_log(m, active, per_sequence, source)
        return 1.0 - lo, hi - 1.0

    def _sat_mu(self, logp: Tensor, inputs: dict) -> tuple[Tensor, MuSource]:
        """SAT's mu for this call [B, T] and where it came from (see ``mu_source``)."""
        return choose_mu(self.mu_source, logp, inputs)

    def _sat_log(self, m: dict[str, Tensor], active: Tensor, per_sequence: bool, source: MuSource) -> None:
        comp = composition(active)
        local = torch.stack([m[k].to(torch.float32) for k in SAT_LOG_KEYS]
                            + [comp["n"].to(torch.float32), comp["shortest"].to(torch.float32)])
        rows = self.accelerator.gather(local[None]).tolist()  # [processes, 7]: one host sync
        mode = "train" if self.model.training else "eval"
        for i, key in enumerate(SAT_LOG_KEYS):  # averaged over processes
            self._metrics[mode][f"sat/{key}"].append(sum(r[i] for r in rows) / len(rows))
        self._metrics[mode]["sat/mu_source"].append(source.value)
        n, shortest = (int(v) for v in rows[self.accelerator.process_index][-2:])
        budget = gate_capacity(n, shortest, self.args.sat_alpha, per_sequence)
        if budget is not None:
            warn_gate_cannot_fire("SATGRPOTrainer", n, shortest, budget, self.args.sat_alpha, per_sequence,
                                  TRL_HINT)


__all__ = ["MU_SOURCES", "SATGRPOConfig", "SATGRPOTrainer", "SAT_LOSS_TYPES", "TRL_PROXIES", "check_mu_source",
           "choose_mu", "ratio_is_one"]
