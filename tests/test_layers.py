"""The import graph keeps its shape (docs/design.md, "Layers and the rules between them"): no cycle between files
in src or benchmarks, and the weight-sync layer imports neither the pipeline nor the engines. Every import
counts, those inside functions too: a lazy import is still a dependency."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"satrl": REPO / "src" / "satrl", "benchmarks": REPO / "benchmarks"}


def _modules() -> dict[str, Path]:
    out = {}
    for top, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports: ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]  # fmt: skip
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        visit(v) if v not in index else None
    return out


def test_cycles_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_files():
    edges = graph()
    # A package's __init__ re-exporting its modules, which import siblings through the package, is one room.
    files = {v: {w for w in ws if not v.startswith(w + ".")} for v, ws in edges.items()}
    assert cycles(files) == []


@pytest.mark.parametrize("forbidden", ["satrl.pipeline", "satrl.engines", "satrl.training"])
def test_the_weight_layer_imports_neither_the_pipeline_nor_the_engines(forbidden):
    edges = graph()
    bad = {v: sorted(w for w in ws if w == forbidden or w.startswith(forbidden + "."))
           for v, ws in edges.items() if v == "satrl.weights" or v.startswith("satrl.weights.")}  # fmt: skip
    assert not any(bad.values()), bad


def _pipeline_imports(package: str) -> dict[str, list[str]]:
    """For each module of ``satrl.pipeline.<package>``: the modules of ``satrl.pipeline`` it imports from outside
    that package."""
    inside = f"satrl.pipeline.{package}"
    return {v: sorted(w for w in ws if w.startswith("satrl.pipeline.") and not w.startswith(inside))
            for v, ws in graph().items() if v == inside or v.startswith(inside + ".")}  # fmt: skip


def test_the_engine_side_imports_only_the_loops_leaves():
    """The engine-process side (workers, backends, the child's loop) knows the lag schedules and the one-line
    errors, nothing else of the loop and nothing of the launch wiring."""
    imported = _pipeline_imports("engine_side")
    assert imported, "no engine_side modules found"
    bad = {v: [w for w in ws if w not in ("satrl.pipeline.errors", "satrl.pipeline.schedules")]
           for v, ws in imported.items()}  # fmt: skip
    assert not any(bad.values()), bad


def test_the_launch_wiring_never_imports_the_loop():
    imported = _pipeline_imports("launch")
    assert imported, "no launch modules found"
    loop = ("satrl.pipeline.orchestrator", "satrl.pipeline.progress", "satrl.pipeline.rollouts")
    bad = {v: [w for w in ws if w in loop] for v, ws in imported.items()}
    assert not any(bad.values()), bad
