"""Counts the weight path (issue 61): the classes of the weight layer, and the hops and files of each walk of a
version that docs/architecture.md quotes.

    python -m benchmarks.weight_path                 # this checkout
    python -m benchmarks.weight_path --root DIR      # another tree, e.g. an older commit: git archive REV | tar -x -C DIR

The rules (docs/architecture.md, "The path of one weight version", says them too):

- **Classes**: the classes defined (at any depth) in the modules of ``src/satrl/weights/``, the layer whose only
  job is the weight path. Also printed: the same count over the engines host (``pipeline/engines_host/``, formerly
  ``pipeline/engine_side/``), most of whose classes serve rollouts, not weights; alias modules define none.
- **Hops**: each numbered list in that section of docs/architecture.md is one walk, one function per line (a
  quoted ``path:line`` and its name). A hop is a call, or a queue or group crossing, that moves the version's
  weights from one line's function to the next: a list of n lines is n - 1 hops. Its files are the distinct
  paths it quotes.

Reads files only: imports nothing of satrl, so it runs on any tree.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOP = re.compile(r"^\d+\. `([\w./-]+\.py):(\d+)` `([A-Za-z_][\w.]*)`")
SECTION = "## The path of one weight version"
HOSTS = ("src/satrl/pipeline/engines_host", "src/satrl/pipeline/engine_side")


def classes(folder: Path) -> dict[str, list[str]]:
    """module file name -> the names of the classes it defines (nested ones too), for each ``.py`` in ``folder``."""
    out = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        out[path.name] = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return out


def walks(doc: str) -> list[list[tuple[str, int, str]]]:
    """The numbered lists of the weight section of ``doc``: each a list of ``(path, line, name)``."""
    if SECTION not in doc:
        raise SystemExit(f"weight_path: no {SECTION!r} section in docs/architecture.md")
    section = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out: list[list[tuple[str, int, str]]] = []
    current: list[tuple[str, int, str]] = []
    for line in section.splitlines():
        m = HOP.match(line)
        if m:
            current.append((m[1], int(m[2]), m[3]))
        elif current and not line.startswith(" "):  # a list ends at its first line that is not a hop
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def report(root: Path) -> str:
    weights = classes(root / "src/satrl/weights")
    host_dir = next((root / h for h in HOSTS if (root / h / "backends.py").is_file()), None)
    host = classes(host_dir) if host_dir is not None else {}
    n_weights = sum(len(c) for c in weights.values())
    n_host = sum(len(c) for c in host.values())
    lines = [f"weight layer (src/satrl/weights/): {n_weights} classes"]
    lines += [f"  {name}: {', '.join(c)}" for name, c in weights.items() if c]
    lines.append(f"with the engines host ({host_dir.relative_to(root) if host_dir else 'none'}): "
                 f"{n_weights + n_host} classes ({n_host} there)")  # fmt: skip
    for i, walk in enumerate(walks((root / "docs/architecture.md").read_text()), 1):
        files = sorted({path for path, _, _ in walk})
        lines.append(f"walk {i}: {len(walk)} functions, {len(walk) - 1} hops, {len(files)} files "
                     f"({walk[0][2]} -> {walk[-1][2]}): {', '.join(Path(f).name for f in files)}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the tree to count (default: this checkout)")
    print(report(ap.parse_args(argv).root))


if __name__ == "__main__":
    main()
