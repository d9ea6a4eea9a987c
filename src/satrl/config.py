"""Run configuration: one pydantic model per component, YAML loading, ``key=value`` overrides.

The config is validated up front (a bad key or value is a :class:`ConfigError` naming the field and what is
allowed), turned into plain arguments at the edge of each component, and saved resolved with every run. A field
that names a choice (an engine, a task, a schedule, ...) is checked against that choice's registry
(:mod:`satrl.registry`), the one list of valid names: a newly registered engine or task is valid here at once.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from satrl.diagnostics.collapse import CollapseConfig
from satrl.objectives.presets import PRESETS, SLOTS, ObjectiveSpec
from satrl.types import ENGINE_TIMEOUT_S


class ConfigError(ValueError):
    """A bad config key or value. The message is one line, naming the field and the allowed values."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # one line, whatever a key or value held


def _show(part: object) -> str:
    """A key part as typed, or quoted (repr) when it holds spaces or unprintable characters."""
    text = str(part)
    return text if text and text.isprintable() and " " not in text else repr(text)


def _registry(where: str):
    """The registry ``where`` (``"module:ATTR"``), imported when first used (registries live next to their
    components, some of which import heavy libraries, and some above this module)."""
    module, attr = where.split(":")
    return getattr(importlib.import_module(module), attr)


def _registered(where: str) -> AfterValidator:
    """A validator: the value must be a name in the registry ``where`` (``"module:ATTR"``), imported when first
    used (registries live next to their components, some of which import heavy libraries)."""

    def check(name: str) -> str:
        return _registry(where).check(name)

    return AfterValidator(check)


# Config fields that name a registered choice (the registry is the only list of valid names).
EngineName = Annotated[str, _registered("satrl.engines.registry:ENGINES")]
NumericsName = Annotated[str, _registered("satrl.engines.numerics:NUMERICS")]
TaskName = Annotated[str, _registered("satrl.tasks:TASKS")]
AggregationName = Annotated[str, _registered("satrl.objectives.aggregation:AGGREGATIONS")]
ScheduleName = Annotated[str, _registered("satrl.pipeline.schedules:SCHEDULES")]
BackendName = Annotated[str, _registered("satrl.pipeline.engine_side.backends:BACKENDS")]
TransportName = Annotated[str, _registered("satrl.weights.transports:TRANSPORTS")]

DEVICES = "cpu, cuda or cuda:N"
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device_name(device: str) -> str:
    """A device's name must be ``cpu``, ``cuda`` or ``cuda:N`` (``meta`` holds no data; torch's other kinds are
    not supported). Whether this machine has it is :func:`check_device_here`'s question, asked where it runs."""
    if not (isinstance(device, str) and _DEVICE.fullmatch(device)):
        raise ValueError(f"got {device!r}; expected {DEVICES}")
    return device


def check_device_here(device: str, key: str) -> None:
    """:class:`ConfigError` naming ``key`` unless ``device`` (a name :func:`check_device_name` took) exists on this
    machine: asked by the command about to use it (a saved config stays loadable on a machine without CUDA)."""
    try:
        check_device_name(device)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
    if device == "cpu":
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= have:
        there = "no CUDA device" if have == 0 else f"{have} CUDA device{'s' if have > 1 else ''} (cuda:0-{have - 1})"
        raise ConfigError(f"{key}={device}: this machine has {there}; use {key}=cpu"
                          + ("" if have == 0 else " or one it has"))  # fmt: skip


Device = Annotated[str, AfterValidator(check_device_name)]

# The most samples one rollout batch may hold (train.prompts_per_batch x train.group_size): 2^20, ~100x the largest
# published RL batches; beyond, allocating the batch (and the first batch's problems) is what runs, for minutes.
MAX_BATCH_SAMPLES = 2**20

# Objective hyperparameters meet the loss in float32 (or bf16, the same range): larger magnitudes do not convert.
FLOAT32_MAX = 3.4028234663852886e38


class _Strict(BaseModel):
    # allow_inf_nan=False: no setting means anything at inf or NaN (train.lr=inf wrecked the weights at step 1 and
    # the run reported success); a bound such as gt=0 alone lets inf through.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(_Strict):
    name: str = Field("tiny-arith", description="Built-in policy (tiny-arith, tiny-arith-moe) if `path` is unset.")
    path: str | None = Field(None, description="Local Hugging Face causal-LM directory; overrides `name`.")

    @property
    def source(self) -> str:
        return self.path or self.name


class TaskConfig(_Strict):
    name: TaskName = Field("arithmetic", description="Task: a name in satrl.tasks.TASKS, or gym:<reasoning_gym dataset>.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the task.")


class EngineConfig(_Strict):
    name: EngineName = Field("torch", description="Engine: a name in satrl.engines.ENGINES (torch; vllm with the extra).")
    numerics: NumericsName = Field(
        "bf16-weights", description="Engine numerics (satrl.engines.NUMERICS); differs from the fp32 trainer so "
        "mismatch is real.",
    )  # fmt: skip
    temperature: float = Field(1.0, ge=0.01, le=100, description="Sampling temperature (paper App. F: 1.0), in "
                               "[0.01, 100]: below, the log-probs of a tempered softmax underflow and every step "
                               "is skipped.")  # fmt: skip
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus truncation; 1.0 keeps full support.")
    top_k: int = Field(0, ge=0, description="Top-k truncation; 0 keeps full support.")
    max_new_tokens: int = Field(8, ge=1, description="Response length cap in tokens.")
    threads: int = Field(1, ge=1, description="torch threads for generation (fixed so results are bitwise stable).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra engine arguments, e.g. vLLM's gpu_memory_utilization or tensor_parallel_size; the torch "
        "engine takes device (cpu, cuda or cuda:N) and max_batch_size, and `satrl train` refuses any other.",
    )
    # A hang is a fault like a death (backend local and ray): past the deadline the engine is killed and
    # restarted, and its batches are re-issued (docs/design.md, "Fault tolerance").
    timeout_s: float = Field(
        ENGINE_TIMEOUT_S, ge=1, description="Seconds the engine may work without returning a rollout before it counts as "
        "hung and is restarted (raise it for long generations on slow hardware; at least 1: deadlines are checked "
        "once a second).",
    )  # fmt: skip
    start_timeout_s: float = Field(
        ENGINE_TIMEOUT_S, ge=1, description="Seconds an engine process may take to start (load the model) before it counts as hung "
        "(at least 1).",
    )
    max_restarts: int = Field(
        3, ge=0, description="Engine deaths or hangs in a row (no rollout in between) tolerated before the run stops."
    )


class ObjectiveConfig(ObjectiveSpec):
    """The objective: a preset, its four typed components with every hyperparameter (saved resolved), and the
    loss aggregation. Flat keys (``objective.alpha=0.8``, ``objective.kl_coef=0``) go to the component that
    declares them; nested ones (``objective.trust_region.alpha=0.8``) name it. Every number of a component is
    at most 3.4e38 in magnitude (float32's range, in which the loss is computed: ``trust_region.eps_high=1e308``
    failed at the first step)."""

    aggregation: AggregationName = Field("token-mean", description="Loss aggregation mode (satrl.objectives.AGGREGATIONS).")

    @model_validator(mode="after")
    def _in_float32(self) -> ObjectiveConfig:
        for slot in SLOTS:
            params = getattr(self, slot)
            for key, value in params:
                if isinstance(value, float) and abs(value) > FLOAT32_MAX:
                    raise ValueError(f"{slot}.{key}={value:g} is beyond float32's range (|x| <= 3.4e38), in which "
                                     "the loss is computed")  # fmt: skip
        return self


class LagConfig(_Strict):
    schedule: ScheduleName = Field(
        "broadcast", description="Lag schedule (satrl.pipeline.schedules.SCHEDULES; docs/design.md, 'Versions and lag')."
    )
    n: int = Field(1, ge=0, description="broadcast: weight-broadcast interval; fixed: exact lag (opt. steps).")
    max_staleness: int = Field(
        8, ge=0, description="Bound on a sample's lag at its batch's last optimizer step; what happens past it: on_stale."
    )
    on_stale: Literal["drop", "hold"] = Field(
        "drop", description="drop: async drops samples past max_staleness (async/dropped), other schedules ignore the "
        "bound; hold: every schedule holds generation back until weights fresh enough exist, nothing is dropped "
        "(async/held counts the held samples; needs max_staleness >= steps per batch - 1).",
    )  # fmt: skip
    inflight_every: int = Field(
        0, ge=0, description="In-flight weight updates: every this many decoded tokens a response moves on one version, "
        "up to the first step of its batch (docs/design.md, 'In-flight updates'); each token records its version. "
        "0 = off. Needs an engine and a backend that declare in-flight support (engine torch or vllm; backend "
        "sequential or local).",
    )  # fmt: skip


class TrainConfig(_Strict):
    lr: float = Field(1e-4, gt=0, le=1, description="Constant learning rate, in (0, 1] (beyond, AdamW's first step "
                      "already wrecks the weights).")  # fmt: skip
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.98), description="Adam betas (paper App. F), each in [0, 1).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW's decoupled weight decay, in [0, 1].")
    grad_clip: float | None = Field(1.0, gt=0, description="Gradient-norm clip, > 0 (0 would zero the gradient, a "
                                    "negative one reverse it); null disables.")  # fmt: skip
    prompts_per_batch: int = Field(
        16, ge=1, le=MAX_BATCH_SAMPLES, description="Prompts per rollout batch, in [1, 2^20]; with group_size at "
        "most 2^20 samples per batch (prompts_per_batch x group_size), refused before anything is allocated.",
    )  # fmt: skip
    group_size: int = Field(
        8, ge=1, le=MAX_BATCH_SAMPLES, description="Samples per prompt (GRPO group), in [1, 2^20]; see "
        "prompts_per_batch for the bound on their product.",
    )  # fmt: skip
    # 1 by default so that configured lag n means the paper's lag n (Sec. 2.1, Fig. 1): with S optimizer steps per
    # rollout batch, broadcast lag n trains at realized lags up to n + 2S - 2 (4-7 for "lag 1" at S = 4).
    minibatches: int = Field(
        1, ge=1, description="Optimizer steps per epoch over a batch (1: configured lag = the paper's lag)."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    microbatch_tokens: int = Field(4096, ge=1, description="Token budget per microbatch (grad accumulation).")
    quantile_scope: Literal["microbatch", "batch"] = Field(
        "microbatch", description="SAT quantile over each microbatch (paper) or the whole minibatch."
    )
    denominator: Literal["rollout", "recomputed"] = Field(
        "rollout", description="Ratio denominator: engine behavior_logp (paper Eq. 51) or trainer recompute."
    )
    adv_std_norm: bool = Field(True, description="Divide group advantages by the group std.")
    threads: int = Field(2, ge=1, description="torch threads for the trainer.")
    max_threads: int | None = Field(
        None, ge=1, description="Cap on `threads` (`satrl grid` sets it so that workers x threads <= cores); null: none."
    )
    device: Device = Field(
        "cpu", description="Trainer device: cpu, cuda or cuda:N (the torch engine's is engine.kwargs.device); `satrl "
        "train` refuses a CUDA device this machine does not have before anything starts.",
    )  # fmt: skip
    rank_timeout_s: float = Field(
        120.0, ge=2, description="Data parallel (torchrun): seconds a rank may go without a heartbeat (one a second, "
        "from a thread of its own) before the job ends naming it (a stopped or frozen process).",
    )  # fmt: skip
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="Trainer compute dtype: fp32, or bf16 forward/backward under torch.autocast with fp32 "
        "master weights, gradients and AdamW state (the reference model is then kept in bf16).",
    )  # fmt: skip
    tf32: bool = Field(True, description="On CUDA, fp32 matmuls on TF32 tensor cores, or not (no effect on CPU).")
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer in the backward instead of saving its activations."
    )
    logprob_chunk_tokens: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        0, description="0: log-probs from full-vocabulary logits (the exact CPU numbers; on CUDA a microbatch whose "
        "logits would not fit in the free device memory is refused before it runs); N > 0: LM head and log-softmax "
        "only at response positions, N tokens at a time, recomputed in the backward (equal to 1e-6); auto: N from "
        "the vocabulary (fp32 [N, vocab] logits <= 2 GiB: 2048 for Qwen3's 151,936 tokens).",
    )  # fmt: skip
    microbatch_order: Literal["shuffled", "by_length"] = Field(
        "shuffled", description="How a minibatch's rows are cut into microbatches: shuffled, in the epoch's random "
        "order (the paper's); by_length, longest first, so rows of about the same length share a microbatch (less "
        "padding, and SAT's per-microbatch quantile is then taken among responses of similar length; docs/design.md "
        "\"Trainer\"). Either way the LM head runs on each microbatch's longest response only.",
    )  # fmt: skip
    compile: bool = Field(
        False, description="torch.compile each decoder layer and the log-prob chunk (inductor), and on CUDA use the "
        "fused AdamW; equal to eager within 1e-5 relative on CPU fp32 (tests/training/test_compile.py).",
    )  # fmt: skip
    lr_lag_scaling: Literal["none", "inverse", "inverse_sqrt"] = Field(
        "none", description="Scale each optimizer step's lr by 1/S (inverse) or 1/sqrt(S) (inverse_sqrt), S the "
        "minibatch's realized lag: the mean lag (trainer version - token version) over its active tokens, clamped "
        "to >= 1, so lag 0 (synchronous) and lag 1 keep lr. none: lr untouched. The base lr is restored after each "
        "step (checkpoints hold it); composes multiplicatively with an objective's step size (VCPO). Logged as "
        "train/lag_lr_scale, train/lr_lag, train/lr_scale.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _batch_fits(self) -> TrainConfig:  # issue 46: prompts_per_batch=1e9 printed nothing for minutes
        if (n := self.prompts_per_batch * self.group_size) > MAX_BATCH_SAMPLES:
            raise ValueError(f"train.prompts_per_batch={self.prompts_per_batch} x train.group_size={self.group_size} "
                             f"= {n:,} samples per rollout batch, beyond the most, 2^20 = {MAX_BATCH_SAMPLES:,}")  # fmt: skip
        return self


class RayConfig(_Strict):
    """Where ``backend=ray`` runs its engine actors (docs/ray.md). These choose placement, never the samples."""

    address: str | None = Field(
        None, description="Ray cluster to join (auto, ray://head:10001, ...); null: a private local cluster."
    )
    workers: int = Field(1, ge=1, description="Engine actors; each batch's prompt groups are split across them.")
    gpus: float = Field(0.0, ge=0, description="GPUs reserved per engine actor.")


class EvalConfig(_Strict):
    """Evaluation: the task's eval problems are split by a fixed hash into disjoint ``val`` and ``test`` parts;
    both are scored at every evaluation, the best step is chosen on val and reported on test."""

    every: int = Field(40, ge=0, description="Evaluate every this many optimizer steps (0: only at the end).")
    at_start: bool = Field(True, description="Also evaluate before training (step 0): the collapse rule's base.")
    k: int = Field(8, ge=1, description="Samples per problem for avg@k.")
    # Defaults fit the built-in arithmetic task's 200 eval problems (97 fall in val, 103 in test).
    val_problems: int = Field(80, ge=1, description="Val-part problems per evaluation (checkpoint selection).")
    test_problems: int = Field(100, ge=1, description="Test-part problems per evaluation (reported scores).")
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


class DiagnosticsConfig(_Strict):
    decompose: bool = Field(True, description="Split d into policy lag and implementation mismatch (extra forward).")


class WeightsConfig(_Strict):
    """How each version's weights reach the engine side (docs/design.md, "Weights travel once per version").
    Either way every version travels once and the engine side holds exactly the versions pending batches need."""

    transport: TransportName = Field(
        "inproc", description="A name in satrl.weights.transports.TRANSPORTS. inproc: a call (sequential), one "
        "pickled state dict per version on the local backend's queue, Ray's object store; dist: backend=local only, "
        "a 2-process torch.distributed group (gloo) between the trainer and the engine process, each version "
        "broadcast once as buckets in the engine's dtype; vllm: backend=local and an engine with its own weight "
        "transfer (engine.name=vllm) only, the same broadcast received and loaded by vLLM's own weight-transfer API "
        "inside vLLM's workers (the engine holds one version).",
    )  # fmt: skip
    bucket_mb: int = Field(256, ge=1, le=2**20, description="dist and vllm: the most MiB per broadcast bucket (a "
                           "larger single tensor gets a bucket of its own).")  # fmt: skip


class CheckpointConfig(_Strict):
    every: int = Field(10, ge=1, description="Checkpoint every this many rollout batches.")


class RunConfig(_Strict):
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
        from satrl.engines.registry import engines_declaring
        from satrl.weights.transports import TRANSPORTS

        transport, kind = self.weights.transport, TRANSPORTS.get(self.weights.transport)
        if self.backend not in kind.backends:
            raise ValueError(f"weights.transport={transport}: only backend={'/'.join(sorted(kind.backends))} "
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


def _parse_scalar(text: str) -> Any:
    """Parse an override value as YAML (so `true`, `8`, `1e-4`, `[1, 2]` work), keeping bare strings."""
    try:
        return yaml.safe_load(text)
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
    for slot, registry in SLOTS.items():
        given = section.get(slot)
        chosen = given.get("name") if isinstance(given, dict) else given
        if chosen == getattr(old, slot):
            keep = registry.get(getattr(new, slot)).defaults
            section[slot] = {k: v for k, v in given.items() if k in keep} if isinstance(given, dict) else {}


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(_show(p) for p in first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        section = _section_for(first["loc"][:-1])
        msg = f"unknown key; valid keys here: {', '.join(sorted(section.model_fields))}"
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
                raise ConfigError(f"{key}.{_show(name)}: the torch engine takes no such argument; valid keys here: "
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
    from satrl.engines.registry import engines_declaring

    if cfg.engine.name not in (engines := engines_declaring("inflight")):
        raise ConfigError(f"lag.inflight_every={K} needs engine.name {' or '.join(engines)} (got {cfg.engine.name}); "
                          "set lag.inflight_every=0")  # fmt: skip
    backends = [name for name, kind in _registry("satrl.pipeline.engine_side.backends:BACKENDS").items() if kind.inflight]
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
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
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
        apply_override(data, key.strip(), _parse_scalar(value))
    return build_config(data)

