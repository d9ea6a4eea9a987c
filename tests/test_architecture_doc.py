"""docs/architecture.md stays true to the code: every hop it quotes points at the name it gives.

The format of a hop, the only one this file reads (docs/architecture.md, "How to read a hop"): a backticked
``path:line`` relative to the repository root, one space, then a backticked identifier, e.g.

    `src/satrl/loop/orchestrator.py:46` `train`

It holds when the file exists, has that line, and the line has the identifier (its last dotted part) as a whole
word. A backticked ``path:line`` with no identifier beside it is refused too, so every quoted line says what it
points at. The page also stays short (at most 200 lines) and the README links it.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
MAX_LINES = 200
HOP = re.compile(r"`([\w./-]+\.py):(\d+)` `([A-Za-z_][\w.]*)`")
PATH_LINE = re.compile(r"`([\w./-]+\.py):(\d+)`")


def hops(text: str) -> list[tuple[str, int, str]]:
    """The ``(path, line, identifier)`` of each hop in ``text``."""
    return [(path, int(line), name) for path, line, name in HOP.findall(text)]


def bad_hops(text: str, repo: Path = REPO) -> list[str]:
    """Each hop of ``text`` that does not hold, and each ``path:line`` with no identifier, as one line."""
    bad = [f"`{m[1]}:{m[2]}` has no `identifier` beside it" for m in PATH_LINE.finditer(text)
           if not HOP.match(text, m.start())]  # fmt: skip
    for path, line, name in hops(text):
        file = repo / path
        if not file.is_file():
            bad.append(f"{path}:{line} `{name}`: no such file")
            continue
        lines = file.read_text().splitlines()
        word = name.split(".")[-1]
        if not 1 <= line <= len(lines):
            bad.append(f"{path}:{line} `{name}`: the file has {len(lines)} lines")
        elif not re.search(rf"\b{re.escape(word)}\b", lines[line - 1]):
            bad.append(f"{path}:{line} `{name}`: the line is {lines[line - 1].strip()!r}")
    return bad


def test_every_hop_points_at_the_name_it_gives():
    text = DOC.read_text()
    assert len(hops(text)) >= 30  # the sample's and the weight version's paths, and the places to add things
    assert bad_hops(text) == []


def test_a_moved_line_or_a_missing_name_is_caught(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\n\ndef train(cfg):\n    return cfg\n")
    assert bad_hops("`m.py:4` `train` and `m.py:4` `pkg.train`", tmp_path) == []
    planted = "`m.py:5` `train` then `gone.py:3` `x` and `m.py:99` `train` and `m.py:4` and `m.py:4` `trai`"
    assert bad_hops(planted, tmp_path) == [
        "`m.py:4` has no `identifier` beside it",
        "m.py:5 `train`: the line is 'return cfg'",
        "gone.py:3 `x`: no such file",
        "m.py:99 `train`: the file has 5 lines",
        "m.py:4 `trai`: the line is 'def train(cfg):'",  # a whole word, not a prefix
    ]


def test_the_page_is_short_and_the_readme_links_it():
    assert len(DOC.read_text().splitlines()) <= MAX_LINES
    assert "(docs/architecture.md)" in (REPO / "README.md").read_text()


def floor_rows(text: str) -> dict[int, list[str]]:
    """The page's floor table: floor -> the backticked module names of its row."""
    return {int(n): re.findall(r"`([\w./]+)`", row) for n, row in re.findall(r"^\| (\d+) \| (.*) \|$", text, re.M)}


def _module(name: str, modules: dict) -> str | None:
    """The module a name of the table stands for (``launch/`` is ``satrl.launch``)."""
    dotted = name.strip("/").removesuffix(".py").replace("/", ".")
    return next((m for m in (dotted, f"satrl.{dotted}", f"satrl.pipeline.{dotted}") if m in modules), None)


def test_the_floor_table_is_test_layers_floors():
    from test_layers import FLOORS, _modules, floor_key

    modules, rows = _modules(), floor_rows(DOC.read_text())
    assert sorted(rows) == sorted(set(FLOORS.values()))
    placed = {name: _module(name, modules) for names in rows.values() for name in names}
    assert [name for name, m in placed.items() if m is None] == []
    assert {name: n for n, names in rows.items() for name in names} == {
        name: FLOORS[floor_key(m)] for name, m in placed.items()}
    assert set(FLOORS) - {floor_key(m) for m in placed.values()} == {"satrl"}  # every floor's keys named, but the root
