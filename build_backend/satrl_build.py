"""satrl's PEP 517 build backend: setuptools' own, plus the commit a wheel or sdist is built from.

``satrl --version`` and every run's ``environment.json`` name the commit of the satrl code that runs. In a git
checkout it is read from git; an installed wheel has no git, so the build records it first, in
``src/satrl/BUILD_COMMIT`` (package data, ignored by git): ``<sha>`` or ``<sha>+dirty`` when the package's tracked
files differ from it. A build from an sdist (no git) keeps the sdist's record. Editable installs run from the
checkout and record nothing. ``pyproject.toml``: ``build-backend = "satrl_build"``, ``backend-path = ["build_backend"]``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every PEP 517/660 hook, as setuptools defines it

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "satrl"


def git_commit(package: Path = PACKAGE) -> str | None:
    """``<sha>`` (``+dirty`` if the package's tracked files differ from it) of the checkout holding ``package``,
    or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno", "--", "."], cwd=package,
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def record_commit(package: Path = PACKAGE) -> str | None:
    """Write ``package/BUILD_COMMIT`` from git (left as it is outside a git checkout); the commit written."""
    commit = git_commit(package)
    if commit is not None:
        (package / "BUILD_COMMIT").write_text(commit + "\n")
    return commit


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    record_commit()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    record_commit()
    return _setuptools.build_sdist(sdist_directory, config_settings)
