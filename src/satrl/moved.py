"""Old import paths kept (issue 61): a module that moved is still importable by its old name, which gives the
very module at the new path (so its objects are the same, and a patch through either name patches both), with one
:class:`DeprecationWarning` per old name and process. No file stands at an old path: a finder on ``sys.meta_path``
(:func:`install`, which ``satrl/__init__.py`` calls) answers for the names in :data:`MOVED`, so a merge still sees
each move as a rename. The library imports the new paths (``tests/test_layers.py`` checks it); an old one is for
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
    "satrl.config_base": "satrl.config.base",
    "satrl.pipeline.run_config": "satrl.config.run",
    "satrl.pipeline.orchestrator": "satrl.loop.orchestrator",
    "satrl.pipeline.progress": "satrl.loop.progress",
    "satrl.pipeline.rollouts": "satrl.loop.rollouts",
    "satrl.pipeline.rundir": "satrl.rundir.files",
    "satrl.pipeline.resume_check": "satrl.rundir.resume_check",
    "satrl.pipeline.launch": "satrl.launch",
}
_WARNED: set[str] = set()


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
        if spec.name not in _WARNED:
            _WARNED.add(spec.name)
            warnings.warn(f"{spec.name} moved to {new}: import that (the old name will go)", DeprecationWarning,
                          stacklevel=_caller_level())  # fmt: skip
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
