"""The import graph keeps its shape (docs/design.md, "Layers and the rules between them"): no cycle between files
in src or benchmarks, no import pointing up the declared floors (:data:`FLOORS`, a folder a floor, which put the
programs, ``satrl/apps/`` and the dispatcher ``satrl/cli.py``, above every library layer), the weight-sync layer
imports neither the pipeline nor the engines, and no library module reaches the config's public face. Every import
counts: those inside functions and under ``TYPE_CHECKING`` (a lazy import is still a dependency),
``importlib.import_module``/``__import__`` calls, which satrl does not use on its own packages (a name in a string
is a dependency the graph could not otherwise see), and strings that name a module of the project (a Hydra
``_target_``, vLLM's ``worker_extension_cls``), which must name something that is there. An old name kept for
users (:data:`satrl.moved.MOVED`) counts as the module it names, and nothing of the project imports one."""

import ast
import functools
import re
from pathlib import Path

import pytest

from satrl.moved import MOVED, new_name

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"satrl": REPO / "src" / "satrl", "benchmarks": REPO / "benchmarks"}

# The floors, bottom (0) up: a module may import its own floor and those below, never one above. A module's floor
# is that of the longest key it is or lies under (``satrl`` itself only for the package's ``__init__``). From floor 4 up,
# one key per folder: the engines' host (pipeline/engines_host/, 5) sits above the loop's leaves it imports.
FLOORS = {
    # 0, leaves: the shared vocabulary, the registry class, the config sections' base (ConfigError), files, and
    # the table of old names (which imports the new module an old name asks for, by its name).
    "satrl": 0, "satrl.types": 0, "satrl.registry": 0, "satrl.tensors": 0, "satrl.dtypes": 0, "satrl.faults": 0,
    "satrl.folders": 0, "satrl.jsonl": 0, "satrl.provenance": 0, "satrl.config_base": 0, "satrl.lazy": 0,
    "satrl.moved": 0,
    # 1-3, the components, each with its config section (<component>/config.py)
    "satrl.models": 1, "satrl.objectives": 1, "satrl.weights": 1,
    "satrl.diagnostics": 2, "satrl.tasks": 2, "satrl.engines": 2,
    "satrl.training": 3, "satrl.integrations": 3,
    # 4-9, the pipeline, a folder a floor: its leaves (errors, lag schedules, the backend's config, the snapshot
    # store, the evaluator), the engines' host, the config (the run config
    # assembled from the sections, and the face that re-exports them), the run directory, the launch wiring, the loop
    "satrl.pipeline": 4,
    "satrl.pipeline.engines_host": 5,
    "satrl.config": 6,
    "satrl.rundir": 7,
    "satrl.launch": 8,
    "satrl.loop": 9,
    # 10, the top of the library: the experiments (grid runner, statistics, reports), which read run directories
    "satrl.experiments": 10,
    # 11, the programs, one per command (satrl/apps/); 12, the dispatcher that wires them (satrl/cli.py)
    "satrl.apps": 11,
    "satrl.cli": 12, "satrl.__main__": 12,
    "benchmarks": 13,
}  # fmt: skip
# The programs and their dispatcher: no library layer imports them (the floors above put them on top).
PROGRAMS = ("satrl.apps", "satrl.cli", "satrl.__main__")

DYNAMIC = ("import_module", "__import__")  # importlib.import_module(...), import_module(...), __import__(...)
DOTTED = re.compile(r"(satrl|benchmarks)(\.[A-Za-z_]\w*)+")  # a string naming a module (and a name in it)
# The config's public face re-exports every section and the run config: the programs, benchmarks and users import
# it; a library module imports the module it needs (satrl.config_base, satrl.config.run).
FACE = "satrl.config"
TABLE = "satrl.moved"  # the old names' table: its strings are names, not imports (test_the_old_names_are_a_table)


@functools.cache
def _parse(source: str) -> ast.Module:
    """A source's tree, once per test process: most tests here walk every file of the project (the trees are only
    read, never changed)."""
    return ast.parse(source)


def _modules() -> dict[str, Path]:
    return dict(_found_modules())


@functools.lru_cache(maxsize=1)
def _found_modules() -> dict[str, Path]:
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


def imports(source: str, modules: dict[str, Path], here: str = "", strings: bool = True) -> tuple[set[str], list[str]]:
    """The project modules ``source`` (the module ``here``) imports, and its ``import_module``/``__import__``
    calls by what they name (``"?"``: not a literal; only those naming the project or unreadable are listed).
    ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``; a dynamic import of the project is an
    edge to the module it names."""
    out, dynamic = set(), []
    package = here if here in modules and modules[here].name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            names = [new_name(a.name) or a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per dot beyond the first
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            base = new_name(base) or base
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)) is not None:
            if target == "?" or target.split(".")[0] in ROOTS:
                dynamic.append(target)
            names = [resolved] if target != "?" and (resolved := _resolve(target, modules)) else []
        elif strings and here != TABLE and (target := _string_target(node, modules)) is not None:
            names = [target[0]]
        else:
            continue
        out |= {n for n in names if n in modules}
    return out, dynamic


def _string_target(node: ast.AST, modules: dict[str, Path]) -> tuple[str, str] | None:
    """A string that is a dotted name in the project (a Hydra ``_target_``, vLLM's ``worker_extension_cls``,
    a logger's name), as ``(module, the rest)``: ``"satrl.engines.vllm_worker.SatrlWorkerExtension"`` is
    ``("satrl.engines.vllm_worker", "SatrlWorkerExtension")``. The code that reads it imports that module, so it is
    an edge like an import. A name of a top package alone (``"benchmarks.md"``, a file) is none."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value)):
        return None
    module = _resolve(node.value, modules)
    return None if module is None or module in ROOTS else (module, node.value[len(module) :].lstrip("."))


def string_targets(source: str, modules: dict[str, Path]) -> list[tuple[str, str]]:
    return [t for node in ast.walk(_parse(source)) if (t := _string_target(node, modules)) is not None]


def graph(strings: bool = True) -> dict[str, set[str]]:
    """Each module's imports (and with ``strings`` the modules its string targets name), an old name counted as the
    module it now is."""
    return {name: set(ws) for name, ws in _graph(strings).items()}  # a copy: callers may change theirs


@functools.cache
def _graph(strings: bool) -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports(path.read_text(), modules, name, strings)[0] - {name} for name, path in modules.items()}


def reached(edges: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in edges.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def dynamic_imports() -> dict[str, list[str]]:
    """Each module's ``import_module``/``__import__`` calls that name the project or a name not in the source."""
    modules = _modules()
    found = {name: imports(path.read_text(), modules, name)[1] for name, path in modules.items() if name != TABLE}
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
    """String targets aside: the code that reads one (Hydra, vLLM) imports its module when it runs, after both
    modules loaded, so a string cannot close an import cycle (``_verl_mu`` names ``verl``'s public
    ``SatPolicyLossConfig``, which ``verl`` serves from ``_verl_loss``, which imports ``_verl_mu``)."""
    assert cycles(_files(graph(strings=False))) == []


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
               "def f(x):\n    importlib.import_module('satrl.loop.orchestrator')\n"
               "    import_module(f'satrl.experiments.{x}')\n    __import__('satrl.config')\n"
               "    from satrl.launch import setup\n")  # fmt: skip
    found, dynamic = imports(planted, modules, "satrl.types")
    assert found == {"satrl.loop.orchestrator", "satrl.experiments", "satrl.config",
                     "satrl.launch.setup"}  # fmt: skip
    assert dynamic == ["satrl.loop.orchestrator", "satrl.experiments.", "satrl.config"]
    assert set(upward({"satrl.types": found})["satrl.types"]) == found
    assert upward({"satrl.loop.orchestrator": {"satrl.types"}}) == {}


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
# The launch wiring never imports the loop: the floors say it (satrl.launch, 8, under satrl.loop, 9).


def test_the_engines_host_imports_only_the_loops_leaves():
    """The engine-process side (workers, backends, the child's loop) knows the lag schedules, the one-line errors
    and what a backend reads of the run config, nothing else of the loop and nothing of the launch wiring."""
    imported = _pipeline_imports("engines_host")
    assert imported, "no engines_host modules found"
    bad = {v: [w for w in ws if w not in LEAVES] for v, ws in imported.items()}
    assert not any(bad.values()), bad


def test_no_library_module_reaches_the_config_face():
    """The face (``satrl.config``) imports every section and the run config; a library module that imports it, or
    imports a module that does, reaches them all (``experiments/changes.py`` did, for the loader alone)."""
    edges = graph()
    library = [v for v in edges if v.startswith("satrl.") and not _is_program(v) and v != FACE]
    assert sorted(v for v in library if FACE in reached(edges, v)) == []
    planted = {"satrl.experiments.a": {"satrl.experiments.b"}, "satrl.experiments.b": {FACE}, FACE: {"satrl.x"}}
    assert FACE in reached(planted, "satrl.experiments.a") and FACE not in reached(planted, FACE)


def test_every_string_target_names_a_name_that_is_there():
    """A dotted string naming the project (vLLM's ``worker_extension_cls``, verl's Hydra ``_target_``) is an edge
    of :func:`graph` (so the floors hold for it) and names a module that defines that name."""
    modules, found = _modules(), {}
    for name, path in modules.items():
        for module, rest in string_targets(path.read_text(), modules) if name != TABLE else ():
            defined = _defined(modules[module].read_text())
            if rest and rest.split(".")[0] not in defined:
                found[name] = [*found.get(name, []), f"{module}.{rest}"]
    assert found == {}
    targets = {(n, m) for n, p in modules.items() for m, _ in string_targets(p.read_text(), modules)}
    assert {("satrl.engines.vllm_engine", "satrl.engines.vllm_worker"),
            ("satrl.integrations._verl_mu", "satrl.integrations.verl")} <= targets  # fmt: skip
    planted = 'CLS = "satrl.loop.orchestrator.train"\nGONE = "satrl.pipeline.buffer.Nothing"\nFILE = "benchmarks.md"\n'
    assert string_targets(planted, modules) == [("satrl.loop.orchestrator", "train"),
                                                ("satrl.pipeline.buffer", "Nothing")]  # fmt: skip
    assert upward({"satrl.engines.vllm_engine": imports(planted, modules)[0]}) == {
        "satrl.engines.vllm_engine": ["satrl.loop.orchestrator", "satrl.pipeline.buffer"]}  # fmt: skip
    read = {m: _defined(modules[m].read_text()) for m in ("satrl.loop.orchestrator", "satrl.pipeline.buffer")}
    assert "train" in read["satrl.loop.orchestrator"] and "Nothing" not in read["satrl.pipeline.buffer"]


def _defined(source: str) -> set[str]:
    """The names a module defines or imports anywhere but inside a function (``TYPE_CHECKING`` blocks included: a
    lazy module ``__getattr__`` serves those names at run time)."""
    out = set()
    for node in ast.walk(_parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def test_the_old_names_are_a_table():
    """Each old name (:data:`satrl.moved.MOVED`) has no file, and names a module that is there and did not move;
    the table's one dynamic import is the new module an old name asks for, and it imports nothing else of satrl."""
    modules = _modules()
    assert {"satrl.pipeline.run_config", "satrl.pipeline.orchestrator", "satrl.pipeline.launch"} <= set(MOVED)
    assert [old for old in MOVED if old in modules] == []
    assert [new for new in MOVED.values() if new not in modules or new_name(new)] == []
    assert imports(modules[TABLE].read_text(), modules, TABLE) == (set(), ["?"])
    assert new_name("satrl.pipeline.launch.setup") == "satrl.launch.setup" and new_name("satrl.pipeline.buffer") is None


def old_names(source: str) -> list[str]:
    """The old names (:data:`satrl.moved.MOVED`) ``source`` imports or names in a string."""
    found = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [node.module] if new_name(node.module) else [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            found.append(node.value)
    return sorted({name for name in found if new_name(name) is not None})


def test_no_module_imports_an_old_name():
    """The library and the benchmarks import the new paths; the old ones are for users and peers' configs."""
    found = {name: old_names(path.read_text()) for name, path in _modules().items() if name != TABLE}
    assert {name: ws for name, ws in found.items() if ws} == {}
    planted = ("from satrl.pipeline.launch import setup\nfrom satrl.pipeline import buffer, rundir\n"
               "import satrl.pipeline.errors\nT = 'satrl.pipeline.run_config.X'\n")  # fmt: skip
    assert old_names(planted) == ["satrl.pipeline.launch", "satrl.pipeline.run_config.X", "satrl.pipeline.rundir"]
