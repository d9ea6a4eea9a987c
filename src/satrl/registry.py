"""Named registries: the one place where a string chooses behaviour.

Every string a user or a config can choose (an engine, a task, a backend, a lag schedule, a tiny model kind,
engine numerics, an objective preset and its components, SAT's gate score, ...) is looked up in a
:class:`Registry`. The registry is the only list of the valid names: the config validates against it, the
command line reports it, and registering a new choice is one decorator or one call::

    ENGINES: Registry[Callable[..., Engine]] = Registry("engine")

    @ENGINES.register("my-engine")          # or: ENGINES.register("my-engine", build_my_engine)
    def build_my_engine(**kwargs): ...

    ENGINES.get("my-engine")                # the builder
    ENGINES.get("nope")                     # UnknownChoice: unknown engine 'nope'; valid choices: [...]

A name registered twice is an error (no silent replacement). This module imports nothing of satrl, so every
layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_MISSING: Any = object()
_ABSENT: Any = object()


def did_you_mean(name: object, choices) -> str:
    """`` (did you mean 'x'?)`` naming the valid choice closest to a misspelt ``name`` (difflib's ratio at least
    0.6), or ``""`` when none is close: for the one-line errors on an unknown key or name."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownChoice(ValueError):
    """A name that is not registered. The message is one line naming the kind and every valid choice."""

    def __init__(self, kind: str, name: object, choices: list[str], hint: str = "") -> None:
        self.kind, self.name, self.choices = kind, name, choices
        super().__init__(f"unknown {kind} {name!r}; valid choices: {choices}{hint}")


class Registry(Generic[T]):
    """A name -> entry table for one kind of choice (e.g. ``Registry("engine")``).

    Args:
        kind: what a name chooses, as the error message says it ("unknown <kind> 'x'").
        entries: initial ``name -> entry`` pairs (same as registering each in turn).
        make: ``make(name, obj, **meta) -> entry``: what is stored for a registered object; the default stores
            the object itself and takes no ``meta``. The objectives' registries store a
            :class:`satrl.objectives.registry.Component` built from the function and its declared defaults.
        fallback: ``fallback(name) -> entry | None`` for names outside the table (e.g. the tasks'
            ``gym:<dataset>`` family); ``None`` means unknown.
        hint: appended to the unknown-name message, describing what ``fallback`` accepts.
    """

    def __init__(
        self,
        kind: str,
        entries: Mapping[str, T] | None = None,
        *,
        make: Callable[..., T] | None = None,
        fallback: Callable[[str], T | None] | None = None,
        hint: str = "",
    ) -> None:
        self.kind, self._make, self._fallback, self._hint = kind, make, fallback, hint
        self._items: dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self._add(name, entry)

    def _add(self, name: str, entry: T) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names are non-empty strings, got {name!r}")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = entry

    def register(self, name: str, obj: Any = _MISSING, **meta: Any) -> Any:
        """Register ``obj`` under ``name`` and return it; without ``obj``, a decorator that does so.

        ``meta`` goes to the registry's ``make`` (e.g. an objective component's ``defaults=``)."""
        if meta and self._make is None:
            raise TypeError(f"the {self.kind} registry takes no metadata, got {sorted(meta)}")

        def add(o: Any) -> Any:
            self._add(name, self._make(name, o, **meta) if self._make is not None else o)
            return o

        return add if obj is _MISSING else add(obj)

    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry of ``name``; :class:`UnknownChoice` (naming the valid choices) if there is none, or
        ``default`` when one is given."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            pass
        found = self._fallback(name) if self._fallback is not None and isinstance(name, str) else None
        if found is not None:
            return found
        if default is not _MISSING:
            return default
        raise UnknownChoice(self.kind, name, self.names(), self._hint)

    def check(self, name: str) -> str:
        """``name`` itself if it is a valid choice, else :class:`UnknownChoice` (for validators)."""
        self.get(name)
        return name

    def names(self) -> list[str]:
        """The registered names, sorted (names that only ``fallback`` accepts are not listed)."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    @contextmanager
    def replaced(self, name: str, obj: Any) -> Iterator[None]:
        """Within the block, ``name`` (already registered) chooses ``obj`` instead (for tests)."""
        old = self.get(name)
        self._items[name] = self._make(name, obj) if self._make is not None else obj
        try:
            yield
        finally:
            self._items[name] = old

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return self.get(name, _ABSENT) is not _ABSENT  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
