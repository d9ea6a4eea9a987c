"""What SAT's mu is under each verl trainer, and the refusal where a trainer cannot carry SAT.

verl 0.9.1 hands a policy loss ``old_log_prob`` and nothing else of the rollout: ``ppo_loss``
(``verl.workers.utils.losses``) selects only ``response_mask``, ``old_log_probs``, ``advantages``,
``rollout_is_weights`` and ``ref_log_prob`` from the micro-batch, so ``rollout_log_probs`` never reach a
loss. Which policy ``old_log_probs`` is, is decided by the trainer on the driver:

- ``algorithm.rollout_correction.bypass_mode=true``: the trainer copies ``rollout_log_probs`` into
  ``old_log_probs`` (v1 ``PPOTrainer._compute_old_log_prob``; legacy and separated trainers
  ``apply_bypass_mode``). SAT's d is then log pi_theta - log mu, the paper's setting. The rollout engine
  produces ``rollout_log_probs`` only with ``actor_rollout_ref.rollout.calculate_log_probs=true``, so bypass
  mode without it is refused (:func:`mu_for`).
- ``bypass_mode=false`` (decoupled, verl's default): ``old_log_probs`` is the recomputed pi_old.

A loss runs on the workers, which receive only ``actor_rollout_ref``, so it cannot read the algorithm
config. The ``satrl_mu`` OmegaConf resolver closes that gap: written as
``+actor_rollout_ref.actor.policy_loss.sat_mu='${satrl_mu:}'`` it is resolved on the driver, where
verl's entry points call ``OmegaConf.resolve(config)`` before any worker exists, reads the whole
config, and leaves ``"rollout"`` or ``"old_policy"`` in the actor's config (or refuses, see
:func:`mu_for`). The loss logs it as ``actor/sat_mu_is_rollout``.

The refusals come earlier still, declared ``sat_mu`` or not: :func:`guard_entry_points` runs
:func:`preflight` at the top of each of verl's PPO entry points (the v1 and legacy ``main_ppo``, the
one-step-off and fully-async recipes), on the driver, before Ray starts; the advice names the fix for that
entry point, and :func:`refuse` prints the line again on its own to stderr when the process exits.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import sys
import warnings
from typing import Any

from omegaconf import OmegaConf

from satrl.integrations._mu import MuSource
from satrl.integrations._verl_variants import VARIANTS

RESOLVER = "satrl_mu"
VERL_MU = {"rollout": MuSource.ENGINE, "old_policy": MuSource.OLD_POLICY}  # sat_mu's values: what they mean
MU_VALUES = tuple(VERL_MU)
# The override that makes verl's trainer tell SAT what old_log_probs is (docs/integrations.md).
MU_OVERRIDE = "+actor_rollout_ref.actor.policy_loss.sat_mu='${satrl_mu:}'"
# Trainers whose bypass helper (rollout_corr_helper.apply_bypass_mode) rewrites policy_loss.loss_mode.
REWRITING_TRAINERS = ("legacy", "fully_async", "one_step_off")
# The one override that makes verl build actor.policy_loss with SAT's keys (docs/integrations.md).
SAT_TARGET = "satrl.integrations.verl.SatPolicyLossConfig"
TARGET_OVERRIDE = f"actor_rollout_ref.actor.policy_loss._target_={SAT_TARGET}"
# What keeps SAT's mu the rollout engine's log-probs in verl's v1 trainer (verl 0.9.1's keys): bypass mode copies
# rollout_log_probs into old_log_probs, and the engine returns them only with calculate_log_probs (verl's
# ppo_trainer.yaml defaults bypass_mode to false, so `main_ppo` without the first key gates SAT on pi_old).
BYPASS = "algorithm.rollout_correction.bypass_mode"
CALC_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"
ENGINE_MU = f"{BYPASS}=true {CALC_LOG_PROBS}=true"
# What to run instead of a trainer that rewrites loss_mode in bypass mode, by entry point: each way out as
# overrides to copy (tests/integrations/test_verl_recipes.py runs them through verl's own main_ppo).
FIX = {
    "legacy": f"set trainer.use_v1=true {ENGINE_MU} (verl's v1 trainer keeps loss_mode in bypass mode)",
    "recipe": (f"run verl's v1 trainer instead of this recipe: python -m verl.trainer.main_ppo "
               f"trainer.v1.trainer_mode=separate_async {ENGINE_MU} plus your SAT, data and model flags (asynchronous "
               "training with SAT's mu the engine's log-probs; the recipes ignore trainer.use_v1)"),
}
# apply_bypass_mode's callers in verl 0.9.1, by module: which entry point reached it.
HELPER_CALLERS = {"verl.trainer.ppo.ray_trainer": "legacy", "verl.experimental.separation.ray_trainer": "recipe"}
_warned_mu: list[str] = []  # at most one entry: one warning per process
_refusals: list[str] = []  # satrl's refusal lines, printed again on their own to stderr when the process exits


def _print_refusals() -> None:
    for line in _refusals:
        print(f"\n{line}", file=sys.stderr, flush=True)


def refuse(line: str) -> ValueError:
    """The one-line refusal as a ``ValueError`` to raise; the line is also printed on its own to stderr
    when the process exits, so it is the last thing a user sees after Hydra's traceback (which verl's
    entry points print before they exit)."""
    if not _refusals:
        atexit.register(_print_refusals)
    if line not in _refusals:
        _refusals.append(line)
    return ValueError(line)


def _node(cfg: Any, key: str) -> Any:
    """``cfg[key]`` of a DictConfig or dict, else None (any other shape has no such node)."""
    return cfg.get(key) if cfg is not None and hasattr(cfg, "get") else None


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
    the driver's config), which satrl does not leave to chance. Also when bypass mode comes without
    ``actor_rollout_ref.rollout.calculate_log_probs=true`` (in a config that has ``actor_rollout_ref.rollout``,
    as every verl trainer's does): the trainer would read rollout log-probs the engine never produced.
    """
    rc = _node(_node(root, "algorithm"), "rollout_correction")
    bypass = bool(_node(rc, "bypass_mode") or False)
    rollout = _node(_node(root, "actor_rollout_ref"), "rollout")
    policy_loss = _node(_node(_node(root, "actor_rollout_ref"), "actor"), "policy_loss")
    loss_mode = _node(policy_loss, "loss_mode") or "vanilla"
    check_target(policy_loss)
    kind = trainer_kind(root)
    if bypass and kind in REWRITING_TRAINERS and loss_mode in VARIANTS:
        fix = FIX["legacy" if kind == "legacy" else "recipe"]
        raise refuse(
            f"satrl: loss_mode={loss_mode} cannot run in the {kind} trainer with "
            f"algorithm.rollout_correction.bypass_mode=true (verl's apply_bypass_mode rewrites loss_mode to "
            f"bypass_mode): {fix}, or set algorithm.rollout_correction.bypass_mode=false (SAT then gates on pi_old)"
        )
    # verl's RolloutConfig defaults calculate_log_probs to false (its YAML to true): a missing key is false.
    if bypass and rollout is not None and not _node(rollout, "calculate_log_probs"):
        raise refuse(
            f"satrl: {BYPASS}=true needs {CALC_LOG_PROBS}=true (verl copies the rollout engine's log-probs into "
            f"old_log_probs, and the engine returns none without it): set {CALC_LOG_PROBS}=true, or "
            f"{BYPASS}=false (SAT then gates on pi_old)"
        )
    return "rollout" if bypass else "old_policy"


def check_target(policy_loss: Any) -> None:
    """Refuse SAT keys in ``actor.policy_loss`` whose ``_target_`` is not satrl's config class.

    verl builds that node with its ``_target_`` class, and verl's own ``PolicyLossConfig`` rejects keys it
    does not know (``__init__() got an unexpected keyword argument 'sat_alpha'``); the refusal names the
    override that is missing. A node without SAT keys needs no override (SAT's defaults apply).
    """
    if policy_loss is None or not hasattr(policy_loss, "keys"):
        return
    keys = sorted(str(k) for k in policy_loss.keys() if str(k).startswith("sat_"))
    target = _node(policy_loss, "_target_")
    if not keys or not isinstance(target, str):
        return
    try:  # the class verl will build the node with, and the keys it accepts
        from hydra.utils import get_class

        cls = get_class(target)
        known = {f.name for f in dataclasses.fields(cls)}
    except Exception:  # not a dataclass satrl can inspect: verl reports what is wrong with it
        return
    unknown = [k for k in keys if k not in known]
    if not unknown:
        return
    sat_keys = sorted(k for k in known if k.startswith("sat_"))
    if sat_keys:  # a class that takes SAT's keys (satrl's SatPolicyLossConfig): a misspelled key
        raise refuse(f"satrl: actor_rollout_ref.actor.policy_loss.{unknown[0]} is not one of SAT's keys {sat_keys}")
    raise refuse(
        f"satrl: actor_rollout_ref.actor.policy_loss has SAT's keys ({', '.join(unknown)}) but its _target_ is "
        f"{target}, which refuses them (unexpected keyword argument '{unknown[0]}'): add {TARGET_OVERRIDE}"
    )


def preflight(config: Any) -> None:
    """satrl's checks of a whole verl config on the driver, before Ray or any worker starts.

    Does nothing unless ``actor_rollout_ref.actor.policy_loss`` selects a satrl ``loss_mode`` or carries
    SAT's keys. Refuses (one line, :func:`refuse`) a missing ``_target_`` override and a trainer whose
    bypass helper would replace SAT, whether or not ``sat_mu`` is declared. verl's PPO entry points call
    it through :func:`guard_entry_points`.
    """
    policy_loss = _node(_node(_node(config, "actor_rollout_ref"), "actor"), "policy_loss")
    if policy_loss is None:
        return
    check_target(policy_loss)
    if _node(policy_loss, "loss_mode") in VARIANTS:
        mu_for(config)


def guard_entry_points() -> None:
    """Run :func:`preflight` in each of verl's PPO entry points, before Ray starts. Idempotent.

    verl 0.9.1's ``main_ppo`` (v1 and legacy trainers) and the mains of the ``one_step_off_policy`` and
    ``fully_async_policy`` recipes all begin with ``auto_set_device(config)`` on the driver, on the config
    Hydra composed, before ``run_ppo`` starts Ray; they import it from ``verl.utils.device`` after ``import
    verl`` has loaded this plug-in, so they get the wrapper. Without the wrapper the refusals come from the
    ``${satrl_mu:}`` resolver inside Ray's TaskRunner (when ``sat_mu`` is declared) or from
    :func:`guard_bypass_helper` at the first training step.
    """
    try:
        from verl.utils import device
    except ImportError:  # pragma: no cover - a verl without it has other entry points
        return
    original = device.auto_set_device
    if getattr(original, "_satrl_guard", False):
        return

    @functools.wraps(original)
    def checked(config, *args, **kwargs):
        preflight(config)
        return original(config, *args, **kwargs)

    checked._satrl_guard = True
    device.auto_set_device = checked


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
    source = VERL_MU.get(sat_mu, MuSource.UNDECLARED)
    if source is MuSource.ENGINE:
        return source.value
    if not _warned_mu:
        _warned_mu.append(loss_mode)
        what = ("verl's recomputed pi_old (decoupled mode), not the rollout engine's log-probs"
                if source is MuSource.OLD_POLICY else
                f"whatever verl put in old_log_probs, which satrl cannot see; declare it with {MU_OVERRIDE}")
        warnings.warn(
            f"satrl loss_mode={loss_mode}: SAT's mu is {what}. Set "
            f"{ENGINE_MU} with trainer.use_v1=true for the paper's mu "
            "(see docs/integrations.md). Warned once per process.",
            RuntimeWarning,
            stacklevel=4,
        )
    return source.value


def guard_bypass_helper(helper: Any = None) -> None:
    """Make verl's ``apply_bypass_mode`` refuse a SAT loss_mode instead of silently replacing it.

    The legacy and separated trainers (fully-async, one-step-off) call it on the driver at every step in
    bypass mode, and it sets ``policy_loss.loss_mode = "bypass_mode"``: SAT would vanish without a word when
    the user did not declare ``sat_mu`` (which refuses earlier, at config time). The guard raises the same
    one line instead; any other loss_mode goes through to verl's function unchanged. Idempotent.

    ``helper``: verl's ``rollout_corr_helper`` module (the plug-in passes it from its post-import hook, as
    soon as the module is imported; verl's callers import the function at their call site); None imports it."""
    if helper is None:
        try:
            from verl.trainer.ppo import rollout_corr_helper as helper
        except ImportError:  # a verl without the helper has nothing to rewrite loss_mode
            return
    original = helper.apply_bypass_mode
    if getattr(original, "_satrl_guard", False):
        return

    @functools.wraps(original)
    def guarded(batch, rollout_corr_config=None, policy_loss_config=None):
        loss_mode = policy_loss_config.get("loss_mode") if policy_loss_config is not None else None
        if loss_mode in VARIANTS:
            caller = HELPER_CALLERS.get(sys._getframe(1).f_globals.get("__name__", ""))
            fix = (FIX[caller] if caller else
                   f"in the legacy trainer {FIX['legacy']}; in the fully-async or one-step-off recipe {FIX['recipe']}")
            raise refuse(
                f"satrl: loss_mode={loss_mode} cannot run where verl's apply_bypass_mode rewrites loss_mode to "
                "bypass_mode (legacy trainer, fully-async and one-step-off recipes with "
                f"algorithm.rollout_correction.bypass_mode=true): {fix}, or set "
                "algorithm.rollout_correction.bypass_mode=false (SAT then gates on pi_old)"
            )
        return original(batch, rollout_corr_config, policy_loss_config)

    guarded._satrl_guard = True
    helper.apply_bypass_mode = guarded
