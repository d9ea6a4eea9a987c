"""Old import paths kept working after a module moved (issue 61: public paths kept): the old path warns once per
process (:func:`moved`), with a ``DeprecationWarning`` naming the new path, and hands out the new module's objects.

A module that moved is still importable by its old name, which gives the very module at the new path (so its
objects are the same, and a patch through either name patches both). No file stands at an old path: a finder on
``sys.meta_path`` (:func:`install`, which ``satrl/pipeline/__init__.py`` calls: every old name is under it) answers for the names in :data:`MOVED`, so
a merge still sees each move as a rename. A name that left a module that stays calls :func:`moved` from that
module's ``__getattr__``. The library imports the new paths (``tests/test_layers.py`` checks it); an old one is for
users, docs and peers' configs. Imports nothing of satrl but, on first use of an old name, the module it names."""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

# old name -> new name; a package's old name also stands for every module under it.
MOVED = {
    "satrl.pipeline.run_config": "satrl.config.run",
    "satrl.pipeline.orchestrator": "satrl.loop.orchestrator",
    "satrl.pipeline.progress": "satrl.loop.progress",
    "satrl.pipeline.rollouts": "satrl.loop.rollouts",
    "satrl.pipeline.rundir": "satrl.rundir.files",
    "satrl.pipeline.resume_check": "satrl.rundir.resume_check",
    "satrl.pipeline.launch": "satrl.launch",
    "satrl.pipeline.engine_side": "satrl.pipeline.engines_host",
}
_WARNED: set[str] = set()  # old paths already warned about in this process


def moved(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn once per process that ``old`` (a module path or ``module.name``) is now ``new``."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} moved to {new}; the old path will be removed", DeprecationWarning, stacklevel=stacklevel)


def new_name(old: str) -> str | None:
    """What the old module name ``old`` is now called (``satrl.pipeline.launch.setup``: ``satrl.launch.setup``);
    None when it did not move."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class _OldNames(MetaPathFinder, Loader):
    """Finds an old name and loads it as the module it now is: no code runs twice, no second copy exists."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, self) if new_name(fullname) is not None else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None  # find_spec answered for this name only
        module = importlib.import_module(new)
        moved(spec.name, new, stacklevel=_caller_level() + 1)
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module ran under its new name."""


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery (``import x``'s frozen frames, which
    :func:`warnings.warn` skips itself, and ``importlib.import_module``), so the warning names the line that
    imported the old name and shows by default when that line is in ``__main__``."""
    frame, level = sys._getframe(2), 2  # 1: create_module
    while frame.f_back is not None:
        frozen = frame.f_code.co_filename.startswith("<frozen importlib._bootstrap")
        if not frozen and frame.f_globals.get("__name__") != "importlib":
            return level
        frame, level = frame.f_back, level + (not frozen)
    return level


_FINDER = _OldNames()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would otherwise load a module
    under a moved package's old name a second time."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
