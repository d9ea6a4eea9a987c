"""Grid files: the spec (pydantic), its validation, and its expansion into runs `<cell>/lag<n>/seed<s>`.

A grid YAML names a base config, cells (name -> `key: value` overrides of `satrl train`, plus the cell
keys base / lags / lag_schedule / label / seeds), lags, seeds (counted from `first_seed`), an optional baseline
cell, steps, the run order
(`order: cell` or `seed`), declared `hypotheses:` and global `extra:` overrides. Values stay YAML scalars and are rendered `key=value` so that yaml.safe_load
reads them back unchanged.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from satrl.config_base import ConfigError, load_yaml

# Keys the grid itself controls; a cell or `extra:` setting them would silently fight the grid.
_RESERVED = {"seed": "--seeds / seeds:", "out": "--out", "lag.n": "lags:", "lag.schedule": "lag_schedule:",
             "steps": "steps:", "train.max_threads": "--threads"}  # fmt: skip
_CELL_KEYS = {"base", "lags", "lag_schedule", "label", "seeds"}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
# The most seeds per cell and lag (seeds:, a cell's seeds:, --seeds) and runs per grid (cells x lags x seeds): a grid
# is expanded into its runs before anything starts, even under --dry-run, so seeds: 1e9 hung with growing memory
# (issue 60). 10^4 seeds is far past any trial's; 10^5 runs, a grid no machine finishes.
MAX_SEEDS = 10**4
MAX_RUNS = 10**5
# run seeds are a run config's seed, in [0, 2^32)
_SEED_END = 2**32


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'objective': {'alpha': 0.8}} -> {'objective.alpha': 0.8}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def render_value(v: Any) -> str:
    """A YAML scalar as it reads back under yaml.safe_load: True -> 'true', None -> 'null', '8' -> "'8'"."""
    text = yaml.safe_dump(v, default_flow_style=True, width=10**9).strip()
    return text.removesuffix("...").strip()


def _check_overrides(overrides: dict[str, Any], where: str) -> dict[str, Any]:
    flat = _flatten(overrides)
    for k, v in flat.items():
        if k in _RESERVED:
            raise ValueError(f"{where}: key {k!r} is set by the grid; use {_RESERVED[k]} instead")
        if isinstance(v, dict | set):
            raise ValueError(f"{where}.{k}: values must be YAML scalars or lists, got {type(v).__name__}")
    return flat


def _distinct_lags(lags: list[int]) -> list[int]:
    twice = sorted({lag for lag in lags if lags.count(lag) > 1})
    if twice:  # one folder per lag: two runs of one lag would start two processes in one run folder
        raise ValueError(f"lag {twice[0]} is listed twice; each lag is run once per cell and seed")
    return lags


Lags = Annotated[list[int], AfterValidator(_distinct_lags)]


class CellSpec(BaseModel):
    """One cell: optional base config, lags, schedule and seed count overriding the grid's, and config overrides."""

    model_config = ConfigDict(extra="forbid")
    base: str | None = None
    lags: Lags | None = None
    # this cell's number of seeds (from the grid's first_seed), e.g. one confirming run beside an 8-seed cell;
    # --seeds does not change it
    seeds: int | None = Field(default=None, ge=1, le=MAX_SEEDS)
    lag_schedule: str | None = None
    label: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)


# An inclusive seed range [first, last].
SeedRange = Annotated[tuple[int, int], AfterValidator(lambda r: r if r[0] <= r[1] else _bad_range(r))]


def _known_endpoint(v: str) -> str:
    if v not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {v!r}; valid choices: {list(ENDPOINTS)}")
    return v


# a summary key a declared comparison may test (ENDPOINTS); anything else is refused naming the choices
Endpoint = Annotated[str, AfterValidator(_known_endpoint)]


def _bad_range(r: tuple[int, int]) -> tuple[int, int]:
    raise ValueError(f"a seed range is [first, last] with first <= last, got {list(r)}")


# Summary keys a hypothesis may name as its endpoint (docs/metrics.md), and the late-window means of test pass@k and
# test greedy accuracy that the report reads from each run's eval.jsonl (store.LATE_EVAL_KEYS).
ENDPOINTS = ("late_test_avg_at_k", "best_test_avg_at_k", "final_test_avg_at_k", "late_avg_at_k", "best_avg_at_k",
             "final_avg_at_k", "d_pi_last25", "gate_rate_mean", "late_test_pass_at_k", "late_test_greedy_acc")  # fmt: skip


class HypothesisSpec(BaseModel):
    """A comparison declared before the runs: ``method`` vs ``base`` at configured ``lag`` on ``endpoint`` (the base
    at ``base_lag`` when it is set: a cell against itself at another lag is a declared staleness damage),
    expected ``greater`` or ``less`` (the two-sided sign-flip test), or ``equivalent`` within ±``margin`` (the two
    one-sided sign-flip tests, ``significance.tost_p``). The report tests the hypotheses of each ``family``
    (default: one for the whole grid) as one Holm family.

    ``base`` may be a list: then the hypothesis is that ``method`` beats *every* listed cell (e.g. "the best
    cell"), tested as an intersection-union test whose p-value is the largest of the pairwise ones (no
    correction is needed inside it; the binding comparison is the one reported)."""

    model_config = ConfigDict(extra="forbid")
    method: str
    base: str | list[str]
    lag: int
    # the base cell's lag when it is not ``lag``: e.g. method grpo at lag 0 vs base grpo at base_lag 128, direction
    # greater, is a pre-registered damage test (the lag-vs-lag tables of a report are exploratory)
    base_lag: int | None = None
    endpoint: Endpoint = "late_test_avg_at_k"
    direction: Literal["greater", "less", "equivalent"] = "greater"
    # validate_default: an equivalence hypothesis without a margin is refused here, naming the field
    margin: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, validate_default=True,
        description="direction: equivalent only: the equivalence margin, in the endpoint's own units (a share for "
        "avg@k: 0.01 is 1 point); the hypothesis is that |mean(method - base)| < margin",
    )  # fmt: skip
    description: str = ""
    # hypotheses of one family share a Holm correction; a grid declaring a second question (e.g. a confirmation
    # beside a repair test) names its families, and the report tests each on its own
    family: str = ""
    # test on these seeds only (inclusive range): a staged trial's confirmation on seeds its screen never saw
    seeds: SeedRange | None = None

    @field_validator("margin")
    @classmethod
    def _margin_with_equivalent(cls, margin: float | None, info: ValidationInfo) -> float | None:
        if "direction" not in info.data:  # direction itself was refused: that error is the one to read
            return margin
        equivalent = info.data["direction"] == "equivalent"
        if equivalent and margin is None:
            raise ValueError("direction: equivalent needs a margin > 0 (in the endpoint's units: 0.01 is 1 point)")
        if margin is not None and not equivalent:
            raise ValueError("only an equivalence hypothesis (direction: equivalent) takes a margin")
        return margin

    @model_validator(mode="after")
    def _one_base_for_equivalence(self) -> HypothesisSpec:
        if self.margin is not None and not isinstance(self.base, str):
            raise ValueError("base: an equivalence hypothesis compares with one base cell, not a list")
        if self.method in ([self.base] if isinstance(self.base, str) else self.base) and self.base_lag in (None, self.lag):
            raise ValueError(f"base: {self.method!r} against itself at the same lag; a damage test sets base_lag")
        return self


class LeaderboardSpec(BaseModel):
    """A ranked table and figure of every cell run at ``lag`` on ``seeds``: each cell's endpoint with its
    interval, its paired difference to ``base`` at ``lag`` (exact sign-flip interval) and the share of
    ``base``'s damage from ``reference_lag`` to ``lag`` it repairs; ``base`` at both lags drawn as reference
    lines. A screen's table also ranks the cells on ``select_on`` (validation), the score a promotion rule uses."""

    model_config = ConfigDict(extra="forbid")
    title: str
    base: str
    lag: int
    reference_lag: int
    seeds: SeedRange | None = None
    endpoint: str = "late_test_avg_at_k"
    # the validation score of a screen's promotion rule: "late_val_avg_at_k" (from each run's eval.jsonl), or none
    select_on: str | None = None
    description: str = ""


class _TwoLags(BaseModel):
    """The four runs per seed of a declared quantity: ``method`` and ``base``, each at ``lag`` and ``reference_lag``."""

    model_config = ConfigDict(extra="forbid")
    method: str
    base: str
    lag: int
    reference_lag: int


class RepairSpec(_TwoLags):
    """A declared repaired fraction: ``method`` vs ``base`` at ``lag`` as a share of the damage ``base`` takes
    from ``reference_lag`` to ``lag`` (``satrl.experiments.stats.repaired_fraction``), on ``seeds``; without
    ``seeds``, on those of the declared hypothesis that tests ``method`` vs ``base`` at ``lag`` (the report's
    ``verdicts.repair_seeds``), else on every seed."""

    endpoint: str = "late_test_avg_at_k"
    seeds: SeedRange | None = None


class InteractionSpec(_TwoLags):
    """A declared interaction (:mod:`satrl.experiments.interaction`): ``method``'s gain over ``base`` at ``lag``
    minus its gain at ``reference_lag``, per seed, on ``seeds``, read against ``margin`` (the endpoint's units: 0.01
    is 1 point of avg@k). An estimate, outside every Holm family; the report adds its section without a flag, as
    ``satrl report --interaction`` adds one for an interaction no grid declared."""

    seeds: SeedRange | None = None
    margin: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _two_sides(self) -> InteractionSpec:
        if self.method == self.base or self.lag == self.reference_lag:  # I_s = 0 for every seed
            raise ValueError("method and base, and lag and reference_lag, must differ: the interaction would be 0")
        return self


class GridSpec(BaseModel):
    """A grid file. `cells:` maps a name to a dict of overrides plus optional keys base/lags/lag_schedule/label."""

    model_config = ConfigDict(extra="forbid")
    name: str = "grid"
    description: str = ""
    base: str | None = None
    cells: dict[str, CellSpec]
    lags: Lags = Field(min_length=1)
    lag_schedule: str = "broadcast"
    seeds: int = Field(default=3, ge=1, le=MAX_SEEDS)
    # seeds run are first_seed .. first_seed + seeds - 1: a new trial on fresh seeds no earlier grid has seen
    first_seed: int = Field(default=0, ge=0, lt=_SEED_END)
    baseline: str | None = None
    # method cell -> the cell it is layered on (e.g. sat_gspo: gspo): the report adds a paired table per pair
    pairs: dict[str, str] = Field(default_factory=dict)
    # name -> declared comparison (pre-registered); the report tests exactly these, Holm-corrected
    hypotheses: dict[str, HypothesisSpec] = Field(default_factory=dict)
    # the share of a staleness damage a method repairs, reported with its interval (declared, like hypotheses)
    repair: RepairSpec | None = None
    # a method's gain at one lag minus at another, estimated with its interval (declared, like hypotheses)
    interactions: list[InteractionSpec] = Field(default_factory=list)
    # ranked tables of every cell at one lag (a screen, a confirmation), each with its figure
    leaderboards: list[LeaderboardSpec] = Field(default_factory=list)
    steps: int | None = Field(default=None, ge=1)
    # "cell": cell by cell (each cell's seeds together); "seed": seed 0 of every cell and lag, then seed 1, ...
    # so that a grid stopped part-way holds the same seeds in every cell (paired comparisons stay possible).
    order: Literal["cell", "seed"] = "cell"
    extra: dict[str, Any] = Field(default_factory=dict)
    # The trial's pre-registered protocol (a path relative to the grid file's folder): `satrl grid` starts no run
    # unless it is committed and unchanged, and records its commit (experiments.preregistration)
    protocol: str | None = None
    # Directory the relative base paths are resolved against (the grid file's folder); set by load_grid.
    root: str = "."

    @field_validator("cells", mode="before")
    @classmethod
    def _split_cells(cls, cells: Any) -> Any:
        if not isinstance(cells, dict) or not cells:
            raise ValueError("cells must be a non-empty mapping: name -> {key: value, ...}")
        out = {}
        for name, body in cells.items():
            if not _NAME_RE.match(str(name)) or str(name) in (".", ".."):  # "..": runs outside --out
                raise ValueError(f"cell name {name!r} may only use letters, digits and _ . + - (not . or ..)")
            body = dict(body or {})
            if "overrides" in body:
                raise ValueError(
                    f"cells.{name}: write overrides directly in the cell, not under 'overrides:'"
                )
            own = {k: body.pop(k) for k in list(body) if k in _CELL_KEYS}
            out[str(name)] = {**own, "overrides": _check_overrides(body, f"cells.{name}")}
        return out

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        return _check_overrides(extra, "extra")

    @model_validator(mode="after")
    def _check(self) -> GridSpec:
        if self.baseline is not None and self.baseline not in self.cells:
            raise ValueError(f"baseline: {self.baseline!r} is not a cell; cells: {sorted(self.cells)}")
        for method, base in self.pairs.items():
            for name in (method, base):
                if name not in self.cells:
                    raise ValueError(f"pairs: {name!r} is not a cell; cells: {sorted(self.cells)}")
        for name, h in self.hypotheses.items():
            bases = [h.base] if isinstance(h.base, str) else h.base
            at_base = ("base_lag", h.base_lag) if h.base_lag is not None else ("lag", h.lag)
            for role, cell, (key, lag) in [("method", h.method, ("lag", h.lag))] + [("base", b, at_base) for b in bases]:
                if cell not in self.cells:
                    raise ValueError(f"hypotheses.{name}.{role}: {cell!r} is not a cell; cells: {sorted(self.cells)}")
                if lag not in self.cell_lags(cell):
                    raise ValueError(f"hypotheses.{name}.{key}: cell {cell!r} does not run lag {lag}")
        r = self.repair
        for i, lb in enumerate(self.leaderboards):
            for lag in (lb.lag, lb.reference_lag):
                if lb.base not in self.cells or lag not in self.cell_lags(lb.base):
                    raise ValueError(f"leaderboards.{i}.base: cell {lb.base!r} does not run lag {lag}; "
                                     f"cells: {sorted(self.cells)}")  # fmt: skip
        for role, cell, lag in ([("method", r.method, r.lag), ("base", r.base, r.lag), ("base", r.base, r.reference_lag)]
                                if r else []):  # fmt: skip
            if cell not in self.cells or lag not in self.cell_lags(cell):
                raise ValueError(f"repair.{role}: cell {cell!r} does not run lag {lag}; cells: {sorted(self.cells)}")
        for i, it in enumerate(self.interactions):
            for cell, lag in ((c, lag) for c in (it.method, it.base) for lag in (it.lag, it.reference_lag)):
                if cell not in self.cells or lag not in self.cell_lags(cell):
                    raise ValueError(f"interactions.{i}: cell {cell!r} does not run lag {lag}; cells: {sorted(self.cells)}")
        for name, cell in self.cells.items():
            if cell.base is None and self.base is None:
                raise ValueError(f"cells.{name}: no base config; set `base:` on the grid or on the cell")
        if why := size_problem(self):
            raise ValueError(why)
        return self

    def base_path(self, cell: str) -> Path:
        """The cell's base config: relative to the grid file's folder if it exists there, else to the cwd."""
        raw = self.cells[cell].base or self.base
        assert raw is not None
        p = Path(raw)
        if p.is_absolute():
            return p
        near = Path(self.root) / p
        return near if near.exists() or not p.exists() else p

    def protocol_path(self) -> Path | None:
        """The protocol file, relative to the grid file's folder; None when the grid names none."""
        return None if self.protocol is None else Path(self.root) / self.protocol

    def cell_lags(self, cell: str) -> list[int]:
        return self.cells[cell].lags or self.lags

    def cell_schedule(self, cell: str) -> str:
        return self.cells[cell].lag_schedule or self.lag_schedule

    def label(self, cell: str) -> str:
        c = self.cells.get(cell)
        return c.label if c and c.label else cell


def _key_twice(node: yaml.Node | None, where: str = "", seen: set[int] | None = None) -> tuple[str, int] | None:
    """The first key given twice in one mapping of a composed YAML document, as (``cells.a``, its line), or
    None. yaml.safe_load keeps the last silently: a grid with two cells of one name would lose the first."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:  # an alias to a node already walked (anchors may even recurse)
        return None
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return next((t for i, v in enumerate(node.value) if (t := _key_twice(v, f"{where}{i}.", seen))), None)
    if not isinstance(node, yaml.MappingNode):
        return None
    keys: set[tuple[str, str]] = set()
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) else "?"
        if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":  # `<<:` merges may override
            if (k.tag, name) in keys:  # by tag too: 1 and '1' are two keys
                return f"{where}{name}", k.start_mark.line + 1
            keys.add((k.tag, name))
        if found := _key_twice(v, f"{where}{name}.", seen):
            return found
    return None


def load_grid(path: str | Path, check_paths: bool = True) -> GridSpec:
    """Read and validate a grid YAML. Errors (ValueError) name the bad field."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"grid file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        raw = load_yaml(text, path) or {}  # anchors and aliases refused: a billion-laughs grid never expands
        twice = _key_twice(yaml.compose(text, Loader=yaml.SafeLoader))
    except ConfigError as e:
        raise ValueError(str(e)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not a readable YAML file ({' '.join(str(e).split())[:200]})") from None
    if twice:
        raise ValueError(f"{path}:{twice[1]}: {twice[0]}: given twice (YAML would keep only the last one); keep "
                         "one, or rename a cell")  # fmt: skip
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a grid is a YAML mapping with base/cells/lags/seeds")
    raw.setdefault("name", path.stem)
    raw["root"] = str(path.parent)
    try:
        spec = GridSpec.model_validate(raw)
    except ValidationError as e:
        msgs = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(grid)'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{path}: {msgs}") from None
    if check_paths:
        for cell in spec.cells:
            if not spec.base_path(cell).exists():
                raise ValueError(f"{path}: cells.{cell}: base config {spec.base_path(cell)} does not exist")
    return spec


@dataclass(frozen=True)
class Run:
    """One training run of the grid."""

    cell: str
    lag: int
    seed: int
    base: Path
    overrides: tuple[str, ...]  # "key=value", without seed= and out=
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.cell}/lag{self.lag}/seed{self.seed}"


def size_problem(spec: GridSpec, seeds: int | None = None) -> str | None:
    """Why the grid cannot be expanded with ``seeds`` per cell and lag (``--seeds``; None: the grid's), or None:
    more than MAX_SEEDS seeds, seeds past a run config's 2^32, or more than MAX_RUNS runs, each in one line naming
    the field."""
    if seeds is not None and seeds > MAX_SEEDS:
        return f"--seeds {seeds}: at most {MAX_SEEDS:,} seeds per cell and lag"
    counts = {name: c.seeds or seeds or spec.seeds for name, c in spec.cells.items()}
    for name, n in counts.items():
        if spec.first_seed + n > _SEED_END:
            return (f"first_seed={spec.first_seed}: cell {name}'s {n} seeds would pass the largest run seed, "
                    f"2^32 - 1 = {_SEED_END - 1}")  # fmt: skip
    total = sum(len(spec.cell_lags(name)) * n for name, n in counts.items())
    if total > MAX_RUNS:
        return (f"seeds: {total:,} runs (cells x lags x seeds), beyond the most a grid may hold, {MAX_RUNS:,}; "
                "lower seeds or split the grid")  # fmt: skip
    return None


def expand(spec: GridSpec, out: str | Path, seeds: int | None = None) -> list[Run]:
    """All runs, cell-major then lag then seed (``order: seed``: seed-major, then cell, then lag).
    Override order: extra, steps, schedule, lag, cell. A grid too large (:func:`size_problem`) is a ValueError."""
    if why := size_problem(spec, seeds):
        raise ValueError(why)
    out = Path(out)
    runs = []
    for cell, c in spec.cells.items():
        for lag in spec.cell_lags(cell):
            ov = {**spec.extra}
            if spec.steps is not None:
                ov["steps"] = spec.steps
            ov["lag.schedule"] = spec.cell_schedule(cell)
            ov["lag.n"] = lag
            ov.update(c.overrides)
            items = tuple(f"{k}={render_value(v)}" for k, v in ov.items())
            n = c.seeds or seeds or spec.seeds
            for s in range(spec.first_seed, spec.first_seed + n):
                runs.append(
                    Run(cell, lag, s, spec.base_path(cell), items, out / cell / f"lag{lag}" / f"seed{s}")
                )
    if spec.order == "seed":
        runs.sort(key=lambda r: r.seed)  # stable: cell and lag order kept within a seed
    return runs


def select(runs: list[Run], patterns: list[str] | None) -> list[Run]:
    """The runs whose name `<cell>/lag<n>/seed<s>` matches any shell pattern (all runs when none given)."""
    if not patterns:
        return runs
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def spec_to_yaml(spec: GridSpec, seeds: int) -> str:
    """The grid as run (seeds filled in, bases resolved), readable back by load_grid(check_paths=False)."""
    cells = {}
    for name, c in spec.cells.items():
        body: dict[str, Any] = {"base": str(spec.base_path(name))}
        body.update(
            {k: getattr(c, k) for k in ("lags", "lag_schedule", "label", "seeds") if getattr(c, k) is not None}
        )
        body.update(c.overrides)
        cells[name] = body
    d = spec.model_dump(exclude={"cells", "root", "base"})
    d.update(seeds=seeds, cells=cells)
    return yaml.safe_dump(d, sort_keys=False)
