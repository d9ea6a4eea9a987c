"""The verl plug-in's entry module lists the loss body's public names by hand (``_LAZY``: importing the body to
read its ``__all__`` would defeat the lazy import); the two lists must stay equal. Read from the sources (no verl
needed), so a name added to one side only fails here."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "satrl" / "integrations"


def _names(path: Path, target: str) -> set[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == target for t in node.targets):
            value = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
            return {ast.literal_eval(e) for e in value.elts}
    raise AssertionError(f"{path.name}: no {target}")


def test_the_entry_modules_lazy_names_are_the_loss_bodys_exports():
    assert _names(SRC / "verl.py", "_LAZY") == _names(SRC / "_verl_loss.py", "__all__")
