"""What SAT's mu is under each verl trainer, and the refusal where a trainer cannot carry SAT.

verl 0.9.1 hands a policy loss ``old_log_prob`` and nothing else of the rollout: ``ppo_loss``
(``verl.workers.utils.losses``) selects only ``response_mask``, ``old_log_probs``, ``advantages``,
``rollout_is_weights`` and ``ref_log_prob`` from the micro-batch, so ``rollout_log_probs`` never reach a
loss. Which policy ``old_log_probs`` is, is decided by the trainer on the driver:

- ``algorithm.rollout_correction.bypass_mode=true``: the trainer copies ``rollout_log_probs`` into
  ``old_log_probs`` (v1 ``PPOTrainer._compute_old_log_prob``; legacy and separated trainers
  ``apply_bypass_mode``). SAT's d is then log pi_theta - log mu, the paper's setting.
- ``bypass_mode=false`` (decoupled, verl's default): ``old_log_probs`` is the recomputed pi_old.

A loss runs on the workers, which receive only ``actor_rollout_ref``, so it cannot read the algorithm
config. The ``satrl_mu`` OmegaConf resolver closes that gap: written as
``+actor_rollout_ref.actor.policy_loss.sat_mu='${satrl_mu:}'`` it is resolved on the driver, where
verl's entry points call ``OmegaConf.resolve(config)`` before any worker exists, reads the whole
config, and leaves ``"rollout"`` or ``"old_policy"`` in the actor's config (or refuses, see
:func:`mu_for`). The loss logs it as ``actor/sat_mu_is_rollout``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from omegaconf import OmegaConf

RESOLVER = "satrl_mu"
MU_VALUES = ("rollout", "old_policy")
# The override that makes verl's trainer tell SAT what old_log_probs is (docs/integrations.md).
MU_OVERRIDE = "+actor_rollout_ref.actor.policy_loss.sat_mu='${satrl_mu:}'"
# Trainers whose bypass helper (rollout_corr_helper.apply_bypass_mode) rewrites policy_loss.loss_mode.
REWRITING_TRAINERS = ("legacy", "fully_async", "one_step_off")
_warned_mu: list[str] = []  # at most one entry: one warning per process


def trainer_kind(root: Any) -> str:
    """Which verl trainer a composed config runs: ``v1``, ``legacy`` or a separated-trainer recipe.

    The recipes' YAML adds top-level keys that verl's ``ppo_trainer`` does not have: ``async_training``
    (fully_async_policy) and ``rollout`` (its resource pool; one_step_off_policy and fully_async both).
    """
    if "async_training" in root:
        return "fully_async"
    if "rollout" in root:
        return "one_step_off"
    trainer = root.get("trainer") or {}
    return "v1" if trainer.get("use_v1", True) else "legacy"


def mu_for(root: Any) -> str:
    """``"rollout"`` or ``"old_policy"``: what verl puts in ``old_log_probs`` under config ``root``.

    Raises ValueError (one line naming the setting to change) when a sat loss_mode is combined with
    bypass mode in a trainer whose ``apply_bypass_mode`` rewrites ``policy_loss.loss_mode`` to
    ``bypass_mode``: SAT would be replaced (on the driver at least, and on the workers whenever they read
    the driver's config), which satrl does not leave to chance.
    """
    from satrl.integrations.verl import VARIANTS  # the registered names (import cycle otherwise)

    rc = (root.get("algorithm") or {}).get("rollout_correction") or {}
    bypass = bool(rc.get("bypass_mode", False))
    actor = ((root.get("actor_rollout_ref") or {}).get("actor") or {})
    loss_mode = (actor.get("policy_loss") or {}).get("loss_mode", "vanilla")
    kind = trainer_kind(root)
    if bypass and kind in REWRITING_TRAINERS and loss_mode in VARIANTS:
        fix = ("set trainer.use_v1=true (v1 keeps loss_mode in bypass mode)" if kind == "legacy" else
               "run verl's v1 trainer (trainer.v1.trainer_mode=separate_async) instead of this recipe")
        raise ValueError(
            f"satrl: loss_mode={loss_mode} cannot run in the {kind} trainer with "
            f"algorithm.rollout_correction.bypass_mode=true (verl's apply_bypass_mode rewrites loss_mode to "
            f"bypass_mode): {fix}, or set algorithm.rollout_correction.bypass_mode=false (SAT then gates on pi_old)"
        )
    return "rollout" if bypass else "old_policy"


def _resolve(*, _root_: Any) -> str:
    return mu_for(_root_)


def register_resolver() -> None:
    """Register ``${satrl_mu:}`` with OmegaConf (idempotent; importing the plug-in does it)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)


def mu_flag(sat_mu: Any, loss_mode: str) -> float:
    """``actor/sat_mu_is_rollout``: 1 when old_log_probs are the engine's, 0 for pi_old, -1 undeclared.

    Warns once per process when SAT's mu is not the rollout engine's, so a run never gates on pi_old
    without saying so.
    """
    if sat_mu is not None and sat_mu not in MU_VALUES:
        raise ValueError(f"actor.policy_loss.sat_mu={sat_mu!r}; choose one of {list(MU_VALUES)} "
                         f"or write {MU_OVERRIDE}")
    if sat_mu == "rollout":
        return 1.0
    if not _warned_mu:
        _warned_mu.append(loss_mode)
        what = ("verl's recomputed pi_old (decoupled mode), not the rollout engine's log-probs"
                if sat_mu == "old_policy" else
                f"whatever verl put in old_log_probs, which satrl cannot see; declare it with {MU_OVERRIDE}")
        warnings.warn(
            f"satrl loss_mode={loss_mode}: SAT's mu is {what}. Set "
            "algorithm.rollout_correction.bypass_mode=true with trainer.use_v1=true for the paper's mu "
            "(see docs/integrations.md). Warned once per process.",
            RuntimeWarning,
            stacklevel=4,
        )
    return 0.0 if sat_mu == "old_policy" else -1.0


def guard_bypass_helper() -> None:
    """Make verl's ``apply_bypass_mode`` refuse a SAT loss_mode instead of silently replacing it.

    The legacy and separated trainers (fully-async, one-step-off) call it on the driver at every step in
    bypass mode, and it sets ``policy_loss.loss_mode = "bypass_mode"``: SAT would vanish without a word when
    the user did not declare ``sat_mu`` (which refuses earlier, at config time). The guard raises the same
    one line instead; any other loss_mode goes through to verl's function unchanged. Idempotent."""
    try:
        from verl.trainer.ppo import rollout_corr_helper as helper
    except ImportError:  # a verl without the helper has nothing to rewrite loss_mode
        return
    original = helper.apply_bypass_mode
    if getattr(original, "_satrl_guard", False):
        return

    @functools.wraps(original)
    def guarded(batch, rollout_corr_config=None, policy_loss_config=None):
        from satrl.integrations.verl import VARIANTS

        loss_mode = policy_loss_config.get("loss_mode") if policy_loss_config is not None else None
        if loss_mode in VARIANTS:
            raise ValueError(
                f"satrl: loss_mode={loss_mode} cannot run where verl's apply_bypass_mode rewrites loss_mode to "
                "bypass_mode (legacy trainer, fully-async and one-step-off recipes with "
                "algorithm.rollout_correction.bypass_mode=true): use trainer.use_v1=true, or set "
                "algorithm.rollout_correction.bypass_mode=false (SAT then gates on pi_old)"
            )
        return original(batch, rollout_corr_config, policy_loss_config)

    guarded._satrl_guard = True
    helper.apply_bypass_mode = guarded
