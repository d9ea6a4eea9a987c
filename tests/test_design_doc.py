"""docs/design.md stays true to the code in what a test can read: every source file it names exists, and every
identifier it quotes in backticks is a name somewhere in src, tests or benchmarks (a renamed or deleted class,
function or key leaves the doc naming nothing, and this fails). The layer rule itself is tests/test_layers.py's."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "design.md").read_text()
GENERIC = {"config.yaml", "base.yaml", "grid.yaml", "shared/DESIGN.md"}  # a run's or a grid's files, or outside


def _words() -> set[str]:
    words: set[str] = set()
    for root in ("src/satrl", "tests", "benchmarks"):
        for path in (REPO / root).rglob("*.py"):
            if path.resolve() == Path(__file__).resolve():
                continue  # this file's planted names would find themselves
            words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text()))
    return words


def _exists(name: str) -> bool:
    p = Path(name)
    for base in (REPO, REPO / "src" / "satrl", REPO / "src", REPO / "docs", REPO / "configs"):
        if (base / p).exists():
            return True
    return any(REPO.glob(f"src/satrl/**/{p.name}")) or any(REPO.glob(f"tests/**/{p.name}"))


def test_every_file_the_design_names_exists():
    named = set(re.findall(r"`([A-Za-z_0-9/.]+\.(?:py|md|yaml))`", DOC)) - GENERIC
    assert named and not [n for n in sorted(named) if not _exists(n)]


def missing_names(doc: str, words: set[str]) -> list[str]:
    """The backticked identifiers of ``doc`` whose last dotted part is no word of the code."""
    quoted = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", doc))
    return [q for q in sorted(quoted) if q.split(".")[-1] not in words and not q.endswith((".py", ".md", ".yaml"))]


def test_every_identifier_the_design_quotes_is_in_the_code():
    words = _words()
    assert missing_names(DOC, words) == []
    planted = DOC + "\nRank 0 calls `DPTrainer.remote_step` through `gone_module.vanished_entry`.\n"
    assert missing_names(planted, words) == ["DPTrainer.remote_step", "gone_module.vanished_entry"]
