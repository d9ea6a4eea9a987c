"""Old import paths kept working after a module moved (issue 61: public paths kept): the old module warns once
per process, with a ``DeprecationWarning`` naming the new path, and hands out the new module's objects.

An alias module calls :func:`moved` and then puts the new module in its own place in ``sys.modules``, so the old
name and the new one are the same module object: the classes are the same classes (``isinstance`` and pickles
agree), never a second copy. Imports nothing of satrl."""

from __future__ import annotations

import warnings

_WARNED: set[str] = set()  # old paths already warned about in this process


def moved(old: str, new: str) -> None:
    """Warn once per process that ``old`` (a module path or ``module.name``) is now ``new``."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} moved to {new}; the old path will be removed", DeprecationWarning, stacklevel=3)
