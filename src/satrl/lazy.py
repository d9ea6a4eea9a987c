"""Packages whose names load when first asked for: ``satrl.engines``, ``satrl.models``, ``satrl.diagnostics``,
``satrl.objectives`` and ``satrl.experiments`` keep their public names while a light module of theirs (a config
section, a registry of names) imports neither torch nor pandas (issue 56: the command line answers at once).

Each package writes its own ``_module(name)``, a ``match`` of import statements (so the import graph sees every
module), and a ``_WHERE`` table (public name -> module); this module gives it the ``__getattr__`` that reads them.
Imports nothing of satrl."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def names_from(package: str, where: Mapping[str, str], module: Callable[[str], ModuleType]) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__``: ``name`` taken from the module ``where[name]``, which
    ``module`` imports on first use; any other name is the usual AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
