"""The run config, assembled from the components' own sections: one pydantic model per component, YAML loading,
``key=value`` overrides, and the checks across sections and before a run.

The config is validated up front (a bad key or value is a :class:`~satrl.config_base.ConfigError` naming the field
and what is allowed), turned into plain arguments at the edge of each component (:mod:`satrl.launch.setup`),
and saved resolved with every run. Each section lives with its component (``satrl/<component>/config.py``,
``LagConfig`` with the schedules, ``RayConfig`` in :mod:`satrl.pipeline.backend_config`) and checks a field that
names a choice (an engine, a task, a schedule, ...) against that choice's registry (:mod:`satrl.registry`), the one
list of valid names: a newly registered engine or task is valid here at once. This module sits above the engine
side, whose ``BACKENDS`` it checks ``backend`` against, and below the run directory and the launch wiring;
:mod:`satrl.config` is its public face (docs/design.md, "Layers and the rules between them").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator

from satrl.config_base import ConfigError, Section, check_device_here, load_yaml, show
from satrl.diagnostics.collapse import CollapseConfig
from satrl.diagnostics.config import DiagnosticsConfig
from satrl.engines.config import EngineConfig, EngineName
from satrl.engines.registry import engines_declaring
from satrl.models.config import ModelConfig
from satrl.objectives.config import ObjectiveConfig
from satrl.objectives.presets import PRESETS, SLOTS
from satrl.pipeline.backend_config import RayConfig
from satrl.pipeline.engines_host.backends import BACKENDS
from satrl.pipeline.schedules import LagConfig
from satrl.registry import did_you_mean
from satrl.tasks.config import TaskConfig
from satrl.training.config import TrainConfig
from satrl.weights.config import WeightsConfig
from satrl.weights.transports import TRANSPORTS

BackendName = Annotated[str, AfterValidator(BACKENDS.check)]  # a name in the registry, the one list of valid names


# The most samples per problem an evaluation (eval.k, `satrl eval --k`) draws: 2^12, far past any avg@k reported;
# satrl eval --k 1e9 generated for hours before its first score (issue 60).
MAX_EVAL_K = 2**12


# The most test problems a late evaluation scores (eval.late_test_problems): far past any trial's need, and a
# bound on the time an evaluation may take before its first score.
MAX_LATE_TEST_PROBLEMS = 2**14


class EvalConfig(Section):
    """Evaluation: the task's eval problems are split by a fixed hash into disjoint ``val`` and ``test`` parts;
    both are scored at every evaluation, the best step is chosen on val and reported on test."""

    every: int = Field(40, ge=0, description="Evaluate every this many optimizer steps (0: only at the end).")
    at_start: bool = Field(True, description="Also evaluate before training (step 0): the collapse rule's base.")
    k: int = Field(8, ge=1, le=MAX_EVAL_K, description="Samples per problem for avg@k, in [1, 2^12].")
    # Defaults fit the built-in arithmetic task's 200 eval problems (97 fall in val, 103 in test).
    val_problems: int = Field(80, ge=1, description="Val-part problems per evaluation (checkpoint selection).")
    test_problems: int = Field(100, ge=1, description="Test-part problems per evaluation (reported scores).")
    late_test_problems: int | None = Field(
        None, ge=1, le=MAX_LATE_TEST_PROBLEMS, description="Test-part problems of the evaluations in the late window "
        "(the last ceil(25 %) of `steps`, whose mean is the primary endpoint `late_test_avg_at_k`), at least "
        "eval.test_problems: the first eval.test_problems of them are the other evaluations' test problems. A "
        "quieter endpoint for the cost of its own evaluations only; null: every evaluation scores eval.test_problems.",
    )  # fmt: skip
    engine: EngineName | None = Field(None, description="Engine for evaluation (default: the rollout engine).")
    engine_kwargs: dict[str, Any] | None = Field(
        None, description="Extra arguments of the evaluation engine (e.g. vLLM's gpu_memory_utilization where it "
        "shares the trainer's GPU while the rollout engine has a GPU of its own); null: engine.kwargs when the "
        "evaluation engine is the rollout engine, else none.",
    )  # fmt: skip
    problem_seed: int | None = Field(
        None, ge=0, description="Seed of the eval problems' draw, passed to the task as eval_seed (tasks with one: "
        "arithmetic, countdown, gym:*); null: the task's own (task.kwargs.eval_seed, default 0: the problems of "
        "every earlier run). Another seed draws a fresh eval set from the same eval partition, still disjoint from "
        "training; val and test stay disjoint (split by a hash of the prompt).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _late_covers_test(self) -> EvalConfig:
        late = self.late_test_problems
        if late is not None and late < self.test_problems:
            raise ValueError(f"eval.late_test_problems={late} is below eval.test_problems={self.test_problems}: the "
                             "late evaluations score the same test problems and more; raise it or set null")  # fmt: skip
        return self


class CheckpointConfig(Section):
    every: int = Field(10, ge=1, description="Checkpoint every this many rollout batches.")


class RunConfig(Section):
    seed: int = Field(0, ge=0, lt=2**32, description="Seed for data order, sampling and init (0 <= seed < 2^32: "
                      "derived seeds, e.g. the microbatch order's seed x 7919 + ..., must fit torch's 64 bits).")
    steps: int = Field(400, ge=1, le=10**9, description="Optimizer steps to train (at most 10^9).")
    out: str | None = Field(None, description="Run directory (default runs/<objective>-<schedule>-n<n>-s<seed>).")
    backend: BackendName = Field(
        "local",
        description="local: engine in its own process; sequential: one process, no overlap; ray: Ray actors (extra).",
    )
    r3: bool = Field(False, description="Routing replay: trainer uses the engine's MoE experts.")
    ray: RayConfig = Field(default_factory=RayConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    lag: LagConfig = Field(default_factory=LagConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    collapse: CollapseConfig = Field(default_factory=CollapseConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)

    @model_validator(mode="after")
    def _transport_fits_backend(self) -> RunConfig:
        transport, kind = self.weights.transport, TRANSPORTS.get(self.weights.transport)
        # each backend declares the transports it carries
        if transport not in BACKENDS.get(self.backend).transports:
            able = sorted(name for name, b in BACKENDS.items() if transport in b.transports)
            raise ValueError(f"weights.transport={transport}: only backend={'/'.join(able)} "
                             f"supports it (got backend={self.backend}); use weights.transport=inproc")  # fmt: skip
        if kind.own_engine_transfer and self.engine.name not in (able := engines_declaring("own_transfer")):
            raise ValueError(f"weights.transport={transport}: needs engine.name={'/'.join(able)} (got "
                             f"{self.engine.name}); use weights.transport=dist")  # fmt: skip
        if self.eval.problem_seed is not None and "eval_seed" in self.task.kwargs:
            raise ValueError(f"eval.problem_seed={self.eval.problem_seed} and task.kwargs.eval_seed="
                             f"{self.task.kwargs['eval_seed']} both choose the eval problems; set one")  # fmt: skip
        return self

    @property
    def task_kwargs(self) -> dict[str, Any]:
        """The task's constructor arguments: ``task.kwargs``, plus ``eval_seed`` when ``eval.problem_seed`` is set."""
        if self.eval.problem_seed is None:
            return dict(self.task.kwargs)
        return {**self.task.kwargs, "eval_seed": self.eval.problem_seed}

    @property
    def trainer_threads(self) -> int:
        """The trainer's torch thread count: ``train.threads``, capped by ``train.max_threads``."""
        return min(self.train.threads, self.train.max_threads or self.train.threads)

    @property
    def steps_per_batch(self) -> int:
        return self.train.minibatches * self.train.ppo_epochs

    def run_dir(self) -> Path:
        name = f"{self.objective.name}-{self.lag.schedule}-n{self.lag.n}-s{self.seed}"
        return Path(self.out) if self.out else Path("runs") / name


def _parse_scalar(text: str, key: str = "override") -> Any:
    """Parse an override value as YAML (so `true`, `8`, `1e-4`, `[1, 2]` work), keeping bare strings; anchors and
    aliases are refused (:func:`~satrl.config_base.load_yaml`)."""
    try:
        return load_yaml(text, f"override {key}")
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted ``key`` in a nested dict. ``engine=vllm`` is shorthand for ``engine.name=vllm``."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: '{part}' is a value, not a section")
        node = child
    leaf = parts[-1]
    section = RunConfig.model_fields.get(leaf) if len(parts) == 1 else None
    if section is not None and isinstance(section.default_factory, type) and not isinstance(value, dict):
        node, leaf = node.setdefault(leaf, {}), "name"
    if node is data.get("objective") and leaf == "name" and isinstance(node, dict):
        _switch_preset(node, value)
    node[leaf] = value


def _switch_preset(section: dict[str, Any], new: Any) -> None:
    """A saved objective section names every component. Switching its preset switches the components the old
    preset chose to the new preset's, keeping the hyperparameters the new components declare."""
    old, new = PRESETS.get(section.get("name", "grpo"), None), PRESETS.get(new, None) if isinstance(new, str) else None
    if old is None or new is None:
        return  # validation names the bad preset
    kept = {k for slot, registry in SLOTS.items() for k in registry.get(getattr(new, slot)).defaults}
    for slot, registry in SLOTS.items():
        given = section.get(slot)
        chosen = given.get("name") if isinstance(given, dict) else given
        if chosen == getattr(old, slot):
            keep = registry.get(getattr(new, slot)).defaults
            section[slot] = {k: v for k, v in given.items() if k in keep} if isinstance(given, dict) else {}
        if given is None or chosen == getattr(old, slot):  # a flat key of the old component (vcpo's ess_step):
            for k in set(registry.get(getattr(old, slot)).defaults) & section.keys() - kept:  # dropped with it
                del section[k]


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(show(p) for p in first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        section = _section_for(first["loc"][:-1])
        msg = (f"unknown key{did_you_mean(first['loc'][-1], section.model_fields)}; valid keys here: "
               f"{', '.join(sorted(section.model_fields))}")
    elif first["type"] == "value_error" and "error" in first.get("ctx", {}):
        msg = str(first["ctx"]["error"])  # our own message (e.g. a registry's), without pydantic's "Value error, "
    elif first["type"] == "literal_error":
        msg = f"got {first.get('input')!r}; {msg}"
    return f"invalid config: {field}: {msg}" if field else f"invalid config: {msg}"  # a check across sections


def _section_for(loc: tuple) -> type[BaseModel]:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            break
        model = field.annotation
    return model


def build_config(data: dict[str, Any]) -> RunConfig:
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None
    except ValueError as err:  # registry errors raised inside validators
        raise ConfigError(f"invalid config: {err}") from None
    _check_inflight(cfg)
    _check_task(cfg)
    return cfg


def check_before_run(cfg: RunConfig) -> None:
    """What ``satrl train`` checks before anything starts, beyond what loading a config checks (a saved config
    stays loadable where these do not hold: on a machine without its GPU, with another engine's arguments, a
    policy not on this machine): the torch engines' extra arguments, ``r3`` against the policy's config.json, and
    that every device the run names exists on this machine."""
    _check_engine_kwargs(cfg)
    _check_r3(cfg)
    _check_one_baseline(cfg)
    for key, device in _devices(cfg):
        check_device_here(device, key)


def _torch_engine_kwargs(cfg: RunConfig) -> list[tuple[str, dict[str, Any]]]:
    """(key, arguments) of each engine of the run that is the torch engine: the rollout and evaluation engines."""
    pairs = [("engine.kwargs", cfg.engine.name, cfg.engine.kwargs),
             ("eval.engine_kwargs", cfg.eval.engine or cfg.engine.name, cfg.eval.engine_kwargs or {})]  # fmt: skip
    return [(key, kwargs) for key, engine, kwargs in pairs if engine == "torch"]


def _devices(cfg: RunConfig) -> list[tuple[str, str]]:
    """The devices a run names, each with its key: the trainer's and the torch engines'."""
    out = [("train.device", cfg.train.device)]
    return out + [(f"{key}.device", kw["device"]) for key, kw in _torch_engine_kwargs(cfg) if "device" in kw]


# What satrl itself passes every engine it builds (or, ``version``, keeps to itself): engine.kwargs and
# eval.engine_kwargs must not name these.
_ENGINE_SET_BY_SATRL = {"self", "model", "model_path", "tokenizer", "eos_token_id", "pad_token_id", "numerics",
                        "capture_routing", "version"}  # fmt: skip


def _check_engine_kwargs(cfg: RunConfig) -> None:
    """The torch engine's extra arguments are its constructor's keywords (``device``, ``max_batch_size``): a
    misspelt one is refused in one line, not met at the first evaluation as a TypeError. Other engines (vLLM: any
    of its own arguments) check theirs when they start."""
    import inspect

    from satrl.engines.torch_engine import TorchEngine

    params = inspect.signature(TorchEngine.__init__).parameters
    takes = sorted(k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k not in _ENGINE_SET_BY_SATRL)
    for key, kwargs in _torch_engine_kwargs(cfg):
        for name in kwargs:
            if name not in takes:
                raise ConfigError(f"{key}.{show(name)}: the torch engine takes no such argument; valid keys here: "
                                  f"{', '.join(takes)}")  # fmt: skip


def _check_r3(cfg: RunConfig) -> None:
    """``r3=true`` replays the engine's MoE routing: refused for a policy whose ``config.json`` declares no experts
    (no ``*expert*`` count above 0). A policy that cannot be read here is left to the loader, which names it; the
    trainer checks the loaded model's routers again."""
    if not cfg.r3:
        return
    from satrl.models.loading import PolicyLoadError, resolve_policy_path

    try:
        hf = json.loads((resolve_policy_path(cfg.model.source) / "config.json").read_text(encoding="utf-8"))
    except (PolicyLoadError, OSError, ValueError):
        return
    if not isinstance(hf, dict):
        return
    if not any("expert" in k and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in hf.items()):
        raise ConfigError(f"r3=true needs an MoE policy; {cfg.model.source!r} is dense (its config.json declares no "
                          "experts): set r3=false, or try model.name=tiny-arith-moe")  # fmt: skip


def _check_one_baseline(cfg: RunConfig) -> None:
    """An objective that brings its own advantage baseline (vcpo's ``baseline``) and a ``train.advantage`` other than
    the default both choose the advantages: refused, naming both (the objective's rule is read off its traits, which
    imports torch: so here, not when the config loads)."""
    from satrl.objectives.step_size import advantage_rule
    from satrl.training.baselines import DEFAULT_ADVANTAGE

    if cfg.train.advantage != DEFAULT_ADVANTAGE and advantage_rule(cfg.objective) is not None:
        raise ConfigError(f"train.advantage={cfg.train.advantage.name}: objective {cfg.objective.name!r} brings its own "
                          "advantage baseline; choose one (train.advantage=group_mean, or for vcpo "
                          "objective.correction.baseline=group_mean)")  # fmt: skip


def _check_task(cfg: RunConfig) -> None:
    """A task whose arguments leave no train or no eval problems (``satrl.tasks.split_problem``) cannot train."""
    from satrl.tasks import split_problem

    why = split_problem(cfg.task.name, cfg.task.kwargs)
    if why:
        raise ConfigError(why)


def _check_inflight(cfg: RunConfig) -> None:
    """In-flight updates switch weights inside the torch engine's decoding loop (the vLLM engine: between blocks of
    K tokens), and wait for a version on the sequential and local backends' message paths: refuse the rest in one
    line rather than ignore the setting."""
    K = cfg.lag.inflight_every
    if not K:
        return
    if cfg.engine.name not in (engines := engines_declaring("inflight")):
        raise ConfigError(f"lag.inflight_every={K} needs engine.name {' or '.join(engines)} (got {cfg.engine.name}); "
                          "set lag.inflight_every=0")  # fmt: skip
    backends = [name for name, kind in BACKENDS.items() if kind.inflight]
    if cfg.backend not in backends:
        raise ConfigError(f"lag.inflight_every={K} needs backend {' or '.join(backends)} (got {cfg.backend}); "
                          "set lag.inflight_every=0")  # fmt: skip


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Load a YAML config (or the defaults), apply ``key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = load_yaml(p.read_text(encoding="utf-8"), p) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not valid YAML ({_one_line(e)})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of config sections at the top level")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. lag.n=8)")
        key, value = item.split("=", 1)
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(f"override {item!r}: empty key or key part in {key!r} (e.g. lag.n=8)")
        apply_override(data, key.strip(), _parse_scalar(value, key.strip()))
    return build_config(data)

