"""The loss body's public names are one list, ``BODY_NAMES`` (``satrl.integrations._verl_variants``): the body's
``__all__`` and the verl plug-in's lazy re-exports are derived from it. The first test reads the sources (no verl
needed): the plug-in's ``TYPE_CHECKING`` import, what editors see, must name the same list. The second imports the
body (verl needed) and checks that each name is defined there and reached through the plug-in."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from run_helpers import Extra
from satrl.integrations._verl_variants import BODY_NAMES

SRC = Path(__file__).resolve().parents[2] / "src" / "satrl" / "integrations"
REQUIRED = os.environ.get("SATRL_REQUIRE_VERL") == "1"  # make test-verl: a missing verl fails, not skips

with Extra("verl") as verl_extra:
    import satrl.integrations._verl_loss as body
    import satrl.integrations.verl as plugin


def _type_checking_imports(path: Path) -> set[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return {alias.name for stmt in node.body if isinstance(stmt, ast.ImportFrom) for alias in stmt.names}
    raise AssertionError(f"{path.name}: no `if TYPE_CHECKING:` block")


def test_the_plugins_type_checking_import_names_the_body_names():
    assert len(set(BODY_NAMES)) == len(BODY_NAMES)
    assert _type_checking_imports(SRC / "verl.py") == set(BODY_NAMES)


@pytest.mark.skipif(verl_extra.missing is not None and not REQUIRED, reason=str(verl_extra.missing))
def test_each_body_name_is_defined_in_the_body_and_reached_through_the_plugin():
    assert verl_extra.missing is None, verl_extra.missing
    assert body.__all__ == list(BODY_NAMES)
    for name in BODY_NAMES:
        assert name in vars(body), name  # defined (or imported) by the body, not only listed
        assert getattr(plugin, name) is vars(body)[name], name
    assert set(BODY_NAMES) <= set(plugin.__all__) and set(BODY_NAMES) <= set(dir(plugin))
    with pytest.raises(AttributeError, match="no attribute 'not_a_body_name'"):
        plugin.not_a_body_name  # noqa: B018
