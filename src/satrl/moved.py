"""Old import paths kept (issue 61): a module that moved leaves at its old path a file of three lines that calls
:func:`alias`, so ``import satrl.pipeline.orchestrator`` still gives the module, now ``satrl.loop.orchestrator``,
with one :class:`DeprecationWarning` per old path and process. The library imports the new paths
(``tests/test_layers.py`` checks it); an old path is for users and peers' configs. Imports nothing of satrl."""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

_WARNED: set[str] = set()


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the alias file and the import machinery (``import x``'s
    frozen frames, ``importlib.import_module``), so the warning names the line that imported the old path and
    shows by default when that line is in ``__main__``. :func:`warnings.warn` skips the frozen frames itself."""
    frame, level = sys._getframe(2).f_back, 2  # 1: alias(), 2: the alias file's body
    while frame is not None and frame.f_back is not None:
        frozen = frame.f_code.co_filename.startswith("<frozen importlib._bootstrap")
        if not frozen and frame.f_globals.get("__name__") != "importlib":
            return level + 1
        frame, level = frame.f_back, level + (not frozen)
    return level + 1


def alias(old: str, new: ModuleType) -> None:
    """Make the old module path ``old`` name the module ``new``; warn the first time in this process.

    A module's old path becomes the very module (``sys.modules``), so its objects are the same and a patch through
    either name patches both. A package's old path keeps its own folder, whose files are the aliases of its old
    submodules; its other names are taken from ``new``."""
    if old not in _WARNED:
        _WARNED.add(old)
        warnings.warn(f"{old} moved to {new.__name__}: import that (the old path will go)", DeprecationWarning,
                      stacklevel=_caller_level())  # fmt: skip
    if hasattr(new, "__path__"):
        sys.modules[old].__getattr__ = lambda name: getattr(new, name)  # type: ignore[method-assign]
    else:
        sys.modules[old] = new
