"""The import graph keeps its shape (docs/design.md, "Layers and the rules between them"): no cycle between files
in src or benchmarks, no import pointing up the declared floors (:data:`FLOORS`, which put the programs,
``satrl/apps/`` and the dispatcher ``satrl/cli.py``, above every library layer), and the weight-sync layer imports
neither the pipeline nor the engines. Every import counts: those inside functions and under ``TYPE_CHECKING`` (a
lazy import is still a dependency), and ``importlib.import_module``/``__import__`` calls, which satrl does not use
on its own packages (a name in a string is a dependency the graph could not otherwise see)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"satrl": REPO / "src" / "satrl", "benchmarks": REPO / "benchmarks"}

# The floors, bottom (0) up: a module may import its own floor and those below, never one above. A module's floor
# is that of the longest key it is or lies under (``satrl`` itself only for the package's ``__init__``).
FLOORS = {
    # 0, leaves: the shared vocabulary, the registry class, the config sections' base (ConfigError), files.
    "satrl": 0, "satrl.types": 0, "satrl.registry": 0, "satrl.tensors": 0, "satrl.dtypes": 0, "satrl.faults": 0,
    "satrl.folders": 0, "satrl.jsonl": 0, "satrl.provenance": 0, "satrl.config_base": 0, "satrl.lazy": 0,
    "satrl.moved": 0,
    # 1-3, the components, each with its config section (<component>/config.py)
    "satrl.models": 1, "satrl.objectives": 1, "satrl.weights": 1,
    "satrl.diagnostics": 2, "satrl.tasks": 2, "satrl.engines": 2,
    "satrl.training": 3, "satrl.integrations": 3,
    # 4-9, the pipeline: its leaves, the engine side, the run config assembled from the sections, the run
    # directory, the launch wiring, the loop
    "satrl.pipeline.errors": 4, "satrl.pipeline.schedules": 4, "satrl.pipeline.backend_config": 4,
    "satrl.pipeline.buffer": 4, "satrl.pipeline.evaluator": 4,
    "satrl.pipeline.engines_host": 5,
    "satrl.pipeline.run_config": 6,
    "satrl.pipeline.rundir": 7, "satrl.pipeline.resume_check": 7,
    "satrl.pipeline.launch": 8,
    "satrl.pipeline": 9,
    # 10, the top of the library: the run config's public face (satrl.config re-exports the run config and its
    # sections) and the experiments (grid runner, statistics, reports), which read run directories
    "satrl.config": 10, "satrl.experiments": 10,
    # 11, the programs, one per command (satrl/apps/); 12, the dispatcher that wires them (satrl/cli.py)
    "satrl.apps": 11,
    "satrl.cli": 12, "satrl.__main__": 12,
    "benchmarks": 13,
}  # fmt: skip
# The programs and their dispatcher: no library layer imports them (the floors above put them on top).
PROGRAMS = ("satrl.apps", "satrl.cli", "satrl.__main__")

DYNAMIC = ("import_module", "__import__")  # importlib.import_module(...), import_module(...), __import__(...)


def _modules() -> dict[str, Path]:
    out = {}
    for top, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _dynamic_target(call: ast.Call) -> str | None:
    """The module name an ``import_module``/``__import__`` call names: a string literal, or an f-string's literal
    head (``f"satrl.experiments.{x}"`` names ``satrl.experiments.``); ``"?"`` when it is neither; None if the call
    is not one of them."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in DYNAMIC:
        return None
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        head = arg.values[0] if arg.values else None
        return head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else "?"
    return "?"


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or lies in (``satrl.experiments.`` is ``satrl.experiments``)."""
    name = name.rstrip(".")
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(source: str, modules: dict[str, Path], here: str = "") -> tuple[set[str], list[str]]:
    """The project modules ``source`` (the module ``here``) imports, and its ``import_module``/``__import__``
    calls by what they name (``"?"``: not a literal; only those naming the project or unreadable are listed).
    ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``; a dynamic import of the project is an
    edge to the module it names."""
    out, dynamic = set(), []
    package = here if here in modules and modules[here].name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per dot beyond the first
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)) is not None:
            if target == "?" or target.split(".")[0] in ROOTS:
                dynamic.append(target)
            names = [resolved] if target != "?" and (resolved := _resolve(target, modules)) else []
        else:
            continue
        out |= {n for n in names if n in modules}
    return out, dynamic


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports(path.read_text(), modules, name)[0] - {name} for name, path in modules.items()}


def dynamic_imports() -> dict[str, list[str]]:
    """Each module's ``import_module``/``__import__`` calls that name the project or a name not in the source."""
    modules = _modules()
    found = {name: imports(path.read_text(), modules, name)[1] for name, path in modules.items()}
    return {name: calls for name, calls in found.items() if calls}


def floor_key(module: str) -> str:
    return max((k for k in FLOORS if module == k or module.startswith(k + ".")), key=len, default="")


def upward(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each module, the modules it imports from a floor above its own."""
    found = {v: sorted(w for w in ws if FLOORS[floor_key(w)] > FLOORS[floor_key(v)]) for v, ws in edges.items()}
    return {v: ws for v, ws in found.items() if ws}


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


def _files(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ re-exporting its modules, which import siblings through the package, is one room.
    return {v: {w for w in ws if not v.startswith(w + ".")} for v, ws in edges.items()}


def test_cycles_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_files():
    assert cycles(_files(graph())) == []


def test_every_module_has_a_declared_floor():
    undeclared = sorted(m for m in _modules() if floor_key(m) in ("", "satrl") and m != "satrl")
    assert not undeclared, f"add them to FLOORS (and to docs/design.md's layers): {undeclared}"


def test_no_import_points_up_the_floors():
    assert upward(graph()) == {}


def _is_program(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PROGRAMS)


def test_the_programs_sit_above_every_library_layer():
    """The floor order says it: every floor of satrl's library lies below the apps', and the dispatcher above them."""
    library = [k for k in FLOORS if (k == "satrl" or k.startswith("satrl.")) and not _is_program(k)]
    assert max(FLOORS[k] for k in library) < FLOORS["satrl.apps"] < FLOORS["satrl.cli"] == FLOORS["satrl.__main__"]


def test_no_library_layer_imports_the_programs():
    library = {v: ws for v, ws in graph().items() if (v == "satrl" or v.startswith("satrl.")) and not _is_program(v)}
    found = {v: sorted(w for w in ws if _is_program(w)) for v, ws in library.items()}
    assert {v: ws for v, ws in found.items() if ws} == {}
    planted = {"satrl.experiments.grid": {"satrl.apps.grid"}, "satrl.training.pretrain": {"satrl.apps.pretrain"},
               "satrl.config": {"satrl.cli"}, "satrl.apps.train": {"satrl.cli"}, "satrl.cli": {"satrl.apps.train"}}
    assert upward(planted) == {"satrl.experiments.grid": ["satrl.apps.grid"], "satrl.config": ["satrl.cli"],
                               "satrl.training.pretrain": ["satrl.apps.pretrain"], "satrl.apps.train": ["satrl.cli"]}


def test_dynamic_imports_are_edges_and_a_planted_upward_one_is_caught():
    modules = _modules()
    planted = ("import importlib\nfrom importlib import import_module\n"
               "def f(x):\n    importlib.import_module('satrl.pipeline.orchestrator')\n"
               "    import_module(f'satrl.experiments.{x}')\n    __import__('satrl.config')\n"
               "    from satrl.pipeline.launch import setup\n")  # fmt: skip
    found, dynamic = imports(planted, modules, "satrl.types")
    assert found == {"satrl.pipeline.orchestrator", "satrl.experiments", "satrl.config",
                     "satrl.pipeline.launch.setup"}  # fmt: skip
    assert dynamic == ["satrl.pipeline.orchestrator", "satrl.experiments.", "satrl.config"]
    assert set(upward({"satrl.types": found})["satrl.types"]) == found
    assert upward({"satrl.pipeline.orchestrator": {"satrl.types"}}) == {}


def test_a_dynamic_import_of_an_unreadable_name_is_flagged():
    modules = _modules()
    for code in ("importlib.import_module(name)", "import_module(PREFIX + name)", "__import__(f'{top}.config')"):
        assert imports(code, modules, "satrl.cli") == (set(), ["?"]), code
    assert imports("importlib.import_module('yaml')", modules, "satrl.cli") == (set(), [])  # not the project's


def test_relative_imports_resolve_from_the_package():
    modules = _modules()
    found, _ = imports("from .registry import Params\nfrom . import vcpo", modules, "satrl.objectives.sat")
    assert found == {"satrl.objectives.registry", "satrl.objectives.vcpo"}


def test_no_module_imports_the_project_by_a_string():
    """A command module, a lazy attribute or a registry is imported by an ``import`` statement (inside a function
    where it must be lazy), so the graph above sees it."""
    assert dynamic_imports() == {}


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


LEAVES = ("satrl.pipeline.errors", "satrl.pipeline.schedules", "satrl.pipeline.backend_config")


def test_the_engines_host_imports_only_the_loops_leaves():
    """The engine-process side (workers, backends, the child's loop) knows the lag schedules, the one-line errors
    and what a backend reads of the run config, nothing else of the loop and nothing of the launch wiring."""
    imported = _pipeline_imports("engines_host")
    assert imported, "no engines_host modules found"
    bad = {v: [w for w in ws if w not in LEAVES] for v, ws in imported.items()}
    assert not any(bad.values()), bad


def test_the_launch_wiring_never_imports_the_loop():
    imported = _pipeline_imports("launch")
    assert imported, "no launch modules found"
    loop = ("satrl.pipeline.orchestrator", "satrl.pipeline.progress", "satrl.pipeline.rollouts")
    bad = {v: [w for w in ws if w in loop] for v, ws in imported.items()}
    assert not any(bad.values()), bad
