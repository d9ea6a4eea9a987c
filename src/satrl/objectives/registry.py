"""Objective components: what the objectives' registries hold, and their typed hyperparameters.

Each objective is composed of four components (ratio level, trust region, correction, KL), each looked up
in its own :class:`satrl.registry.Registry` (the one registry class, made by :func:`component_registry`).
A component declares its hyperparameters as a pydantic model (a subclass of :class:`Params`: typed,
documented, range-checked), which the registry names after the component: the model's ``name`` field is
the literal component name, so a component's config ``{name: sat, alpha: 0.8}`` is validated by the model
the name chooses. This is the one validation system, for configs and for :func:`~.presets.resolve_objective`.

A component's function may be registered itself, or :class:`Deferred`: found where it lives when the component is
first called. satrl's own components are deferred (:mod:`satrl.objectives.components`), so that naming and
validating them, as a config does, imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from satrl.registry import Registry, UnknownChoice, did_you_mean

__all__ = ["Component", "Deferred", "Params", "Registry", "UnknownChoice", "component_registry", "one_line"]


class Params(BaseModel):
    """A component's hyperparameters. Subclasses declare fields with defaults and descriptions; the registry
    adds ``name`` (the component's name, a literal). Frozen, no extra keys, no inf/NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = Field(description="The component's registered name.")

    def kwargs(self) -> dict[str, Any]:
        """The hyperparameters as keyword arguments for the component's function (``name`` left out)."""
        return {k: getattr(self, k) for k in type(self).model_fields if k != "name"}


class Deferred(NamedTuple):
    """A component's function, registered by how to find it: ``load()`` imports the module it lives in (a tensor
    module: torch) and returns it, when the component is first called."""

    load: Callable[[], Callable[..., Any]]


@dataclass(frozen=True)
class Component:
    """One registered choice: its function (or where to find it), its hyperparameter model and what it declares
    about itself."""

    name: str
    impl: Callable[..., Any] | Deferred
    params: type[Params]
    # What the component declares, so that nothing downstream compares its name: the optional inputs it
    # reads (``ref_logp``, ``old_logp``, ``lag``) and free-form traits (e.g. an aggregation's ``share``; a
    # component's ``step_size`` or ``advantage`` rule, read by satrl.objectives.step_size).
    needs: frozenset[str] = frozenset()
    traits: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        name: str,
        fn: Callable[..., Any] | Deferred,
        *,
        params: type[Params] = Params,
        needs: tuple[str, ...] = (),
        traits: Mapping[str, Any] | None = None,
    ) -> Component:
        """The component ``name`` of ``fn`` (the function, or :class:`Deferred`); ``params`` gets a
        ``name: Literal[name]`` field."""
        named = create_model(
            f"{params.__name__}<{name}>",
            __base__=params,
            __doc__=params.__doc__,
            name=(Literal[name], Field(name, description="The component's registered name.")),
        )
        return cls(name, fn, named, frozenset(needs), MappingProxyType(dict(traits or {})))

    @property
    def fn(self) -> Callable[..., Any]:
        """The component's function (a deferred one is imported now, once per process)."""
        return self.impl.load() if isinstance(self.impl, Deferred) else self.impl

    @property
    def defaults(self) -> dict[str, Any]:
        """Every hyperparameter's default (``name`` left out)."""
        return self.params().kwargs()

    def validate(self, values: Mapping[str, Any]) -> Params:
        """``values`` (without ``name``) as this component's typed hyperparameters; ValueError, one line,
        naming the key, if one is unknown or out of range."""
        try:
            return self.params.model_validate({**values, "name": self.name})
        except ValidationError as err:
            raise ValueError(one_line(err, f"{self.name}: ", list(self.defaults))) from None


def one_line(err: ValidationError, prefix: str = "", fields: list[str] | None = None) -> str:
    """The first error of a pydantic ValidationError as one line, ``<prefix><field>: <message>``; ``fields``:
    the valid keys, listed for an unknown key."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden" and fields is not None:
        msg = f"unknown key{did_you_mean(first['loc'][-1], fields)}; valid keys: {sorted(fields)}"
    elif first["type"] == "literal_error":
        msg = f"got {first.get('input')!r}; {msg}"
    elif first["type"] == "value_error" and "error" in first.get("ctx", {}):
        msg = str(first["ctx"]["error"])
    return f"{prefix}{loc}: {msg}" if loc else f"{prefix}{msg}"


def component_registry(kind: str) -> Registry[Component]:
    """A :class:`satrl.registry.Registry` of objective components: ``register(name, params=, needs=,
    traits=)`` decorates the component's function and stores its :class:`Component`; ``register(name,
    Deferred(load), params=, ...)`` registers one found where it lives when first called."""
    return Registry(kind, make=Component.of)
