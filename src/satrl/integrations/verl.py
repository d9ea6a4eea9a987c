"""SAT as verl policy losses: ``actor_rollout_ref.actor.policy_loss.loss_mode=sat`` in a stock verl.

verl imports this module by itself, at ``import verl`` in every verl process (driver and Ray workers),
through the ``verl.plugins`` entry point that ``pip install '.[verl]'`` declares. See docs/integrations.md.

| loss_mode            | satrl preset | gate score          | gated tail                  |
| -------------------- | ------------ | ------------------- | --------------------------- |
| `sat`                | `sat_grpo`   | abs(d) (the paper)  | top (the paper)             |
| `sat_invert`         | `sat_grpo`   | abs(d)              | bottom (falsification test) |
| `sat_prob_diff`      | `sat_grpo`   | abs(pi - mu)        | top                         |
| `sat_gspo`           | `sat_gspo`   | abs(d) of sequence  | top                         |
| `sat_gspo_invert`    | `sat_gspo`   | abs(d) of sequence  | bottom                      |
| `sat_gspo_prob_diff` | `sat_gspo`   | abs(pi - mu)        | top                         |

Importing it is cheap on purpose (it imports no ``satrl.objectives``, no verl module that ``import verl`` has
not already imported, and so no transformers either): it

- registers the ``${satrl_mu:}`` resolver and wraps verl's entry points' ``auto_set_device`` (satrl's
  config-time checks, :mod:`satrl.integrations._verl_mu`);
- registers the six losses in verl's policy-loss registry (``verl.trainer.ppo.core_algos``) as soon as
  anything imports ``core_algos`` (at once if something already has), and guards verl's
  ``apply_bypass_mode`` as soon as ``rollout_corr_helper`` is imported: a post-import hook
  (:class:`_AfterImport`), so a verl process that never builds a policy loss never pays for them;
- registers light stubs (:data:`LOSS_FNS`): the loss body, :mod:`satrl.integrations._verl_loss`, is imported
  with ``satrl.objectives`` on the first loss call.

The body's names (:class:`SatPolicyLossConfig`, :func:`objective_from_config`, :func:`sat_policy_loss`, ...)
are attributes of this module too, imported on first access, so verl's
``_target_=satrl.integrations.verl.SatPolicyLossConfig`` and ``from satrl.integrations.verl import ...`` work.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

try:
    import verl  # noqa: F401  (already imported, or being imported, when verl loads this plug-in)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"satrl.integrations.verl needs verl ({exc}); install it with `pip install '.[verl]'`"
    ) from exc

from satrl.integrations._verl_mu import (
    MU_OVERRIDE,
    guard_bypass_helper,
    guard_entry_points,
    register_resolver,
)
from satrl.integrations._verl_variants import BODY_NAMES, VARIANTS, Variant

if TYPE_CHECKING:  # BODY_NAMES, for editors and type checkers; at run time imported on first access (__getattr__)
    from satrl.integrations._verl_loss import (  # noqa: F401  (tests/integrations/test_verl_lazy_names.py)
        DEFAULT_CLIP_RATIO_C,
        MU_METRIC,
        PPO_KL_CLAMP,
        SAT_KEYS,
        SAT_METRICS,
        VERL_HINT,
        VERL_PROXIES,
        SatPolicyLossConfig,
        composition,
        gate_capacity,
        objective_from_config,
        sat_policy_loss,
        verl_metrics,
    )

CORE_ALGOS = "verl.trainer.ppo.core_algos"  # holds POLICY_LOSS_REGISTRY
BYPASS_HELPER = "verl.trainer.ppo.rollout_corr_helper"  # holds apply_bypass_mode
# Names of the loss body (satrl.integrations._verl_loss): its __all__, imported on first access (module __getattr__).
_LAZY = frozenset(BODY_NAMES)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from satrl.integrations import _verl_loss  # the body, imported on first access

        return getattr(_verl_loss, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)


def _make_loss_fn(loss_mode: str):
    default_agg = VARIANTS[loss_mode].default_agg

    def loss_fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode: str = default_agg,
        config: Any = None,
        rollout_is_weights=None,
    ):
        from satrl.integrations._verl_loss import sat_policy_loss  # the body, imported on the first call

        return sat_policy_loss(
            loss_mode,
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode,
            config,
            rollout_is_weights,
        )

    loss_fn.__name__ = f"compute_policy_loss_{loss_mode}"
    loss_fn.__qualname__ = loss_fn.__name__
    loss_fn.__doc__ = f"verl policy loss ``{loss_mode}``: satrl preset ``{VARIANTS[loss_mode].preset}``."
    loss_fn.satrl_loss_mode = loss_mode
    return loss_fn


LOSS_FNS = {name: _make_loss_fn(name) for name in VARIANTS}


def register(core_algos: Any = None) -> list[str]:
    """Put satrl's losses into verl's registry (idempotent); returns their names.

    ``core_algos``: verl's module (the post-import hook passes it); None imports it. Refuses (ValueError) to
    replace a different loss that verl or another plug-in registered under one of these names.
    """
    if core_algos is None:
        from verl.trainer.ppo import core_algos

    registry = core_algos.POLICY_LOSS_REGISTRY
    for name, fn in LOSS_FNS.items():
        held = registry.get(name)
        if held is not None and getattr(held, "satrl_loss_mode", None) != name:
            raise ValueError(
                f"verl already has a policy loss {name!r} ({held.__module__}.{held.__name__}); "
                "satrl will not replace it, uninstall the other plug-in or rename it"
            )
        core_algos.register_policy_loss(name)(fn)
    return list(LOSS_FNS)


def _register_when_imported(core_algos: Any) -> None:
    """The post-import hook's registration: a refusal must not break verl's own ``core_algos`` import."""
    try:
        register(core_algos)
    except ValueError as exc:
        warnings.warn(f"satrl: {exc}", RuntimeWarning, stacklevel=2)


class _Loader:
    """A module's own loader, plus the hook's callbacks once the module has executed."""

    def __init__(self, loader: Any, hook: _AfterImport):
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._hook.fire(module.__name__, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class _AfterImport:
    """A ``sys.meta_path`` finder that runs callbacks right after a named module executes (post-import hook).

    It finds nothing itself: for a watched name it asks the finders after it and wraps the spec's loader,
    so the module is the one Python would import anyway; it leaves ``sys.meta_path`` when nothing is watched.
    """

    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}
        self._finding: set[str] = set()

    def watch(self, name: str, callback) -> None:
        module = sys.modules.get(name)
        if module is not None:  # already imported: now
            callback(module)
            return
        self.callbacks.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def fire(self, name: str, module: Any) -> None:
        callbacks = self.callbacks.pop(name, [])
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in callbacks:
            callback(module)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in self.callbacks or fullname in self._finding:
            return None
        self._finding.add(fullname)  # a finder below that asks sys.meta_path again gets no answer here
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, self)
                    return spec
            return None
        finally:
            self._finding.discard(fullname)

    def invalidate_caches(self) -> None:
        pass


_after_import = _AfterImport()

register_resolver()  # ${satrl_mu:}, resolved on verl's driver (import verl loads this module there too)
guard_entry_points()  # refusals on verl's driver before Ray starts (the PPO entry points' auto_set_device)
_after_import.watch(CORE_ALGOS, _register_when_imported)  # the losses, where anything can look them up
_after_import.watch(BYPASS_HELPER, guard_bypass_helper)  # no silent replacement of SAT by verl

__all__ = ["BYPASS_HELPER", "CORE_ALGOS", "LOSS_FNS", "MU_OVERRIDE", "VARIANTS", "Variant", "register"]
__all__ += BODY_NAMES  # the loss body's names, imported on first access
