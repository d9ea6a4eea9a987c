"""Objective components: what the objectives' registries hold.

Each objective is composed of four components (ratio level, trust region, correction, KL), each looked up
in its own :class:`satrl.registry.Registry` (the one registry class, made by :func:`component_registry`).
A component declares its hyperparameters with defaults, and the allowed values of its string-valued ones,
so that a preset plus overrides can be validated before any tensor is touched. Every lookup error is a
``ValueError`` that names the valid choices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from satrl.registry import Registry, UnknownChoice

__all__ = ["Component", "Registry", "UnknownChoice", "component_registry", "dual_clip_ok", "non_negative",
           "positive", "unit_interval"]  # fmt: skip


@dataclass(frozen=True)
class Component:
    """One registered choice: its function, its hyperparameters (name -> default) and their checks."""

    name: str
    fn: Callable[..., Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    checks: Mapping[str, tuple[Callable[[Any], bool], str]] = field(default_factory=dict)
    # What the component declares about itself, so that nothing downstream compares its name: the optional
    # inputs it reads (``ref_logp``, ``old_logp``) and free-form traits (e.g. an aggregation's ``share``).
    needs: frozenset[str] = frozenset()
    traits: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        name: str,
        fn: Callable[..., Any],
        *,
        defaults: Mapping[str, Any] | None = None,
        choices: Mapping[str, tuple[Any, ...]] | None = None,
        checks: Mapping[str, tuple[Callable[[Any], bool], str]] | None = None,
        needs: tuple[str, ...] = (),
        traits: Mapping[str, Any] | None = None,
    ) -> Component:
        """The component ``name`` of ``fn`` with what it declares (read-only mappings)."""
        return cls(
            name,
            fn,
            MappingProxyType(dict(defaults or {})),
            MappingProxyType(dict(choices or {})),
            MappingProxyType(dict(checks or {})),
            frozenset(needs),
            MappingProxyType(dict(traits or {})),
        )

    def validate(self, name: str, value: Any) -> None:
        """Raise ValueError if ``value`` is not allowed for hyperparameter ``name``."""
        if name in self.choices and value not in self.choices[name]:
            raise ValueError(
                f"{self.name}: {name}={value!r} is not valid; choose one of {list(self.choices[name])}"
            )
        if name in self.checks:
            ok, what = self.checks[name]
            if not ok(value):
                raise ValueError(f"{self.name}: {name}={value!r} is not valid; it must be {what}")


def component_registry(kind: str) -> Registry[Component]:
    """A :class:`satrl.registry.Registry` of objective components: ``register(name, defaults=, choices=,
    checks=, needs=, traits=)`` decorates the component's function and stores its :class:`Component`."""
    return Registry(kind, make=Component.of)


def positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def non_negative(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0


def unit_interval(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1


def dual_clip_ok(x: Any) -> bool:
    return x is None or (positive(x) and x > 1)
