"""Turn a :class:`~satrl.config.RunConfig` into plain-argument components (the config stops here)."""

from __future__ import annotations

from collections.abc import Callable

from satrl.config import ConfigError, RunConfig
from satrl.pipeline.data_parallel import load_policy_here, trainer_factory
from satrl.pipeline.evaluator import EvalEngineSpec, EvalPlan, Evaluator
from satrl.pipeline.rundir import RunDir
from satrl.pipeline.worker import WorkerSpec
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer
from satrl.types import SamplingParams


def sampling_params(cfg: RunConfig) -> SamplingParams:
    e = cfg.engine
    return SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_new_tokens=e.max_new_tokens)


def worker_spec(cfg: RunConfig) -> WorkerSpec:
    return WorkerSpec(
        model=cfg.model.source,
        task=cfg.task.name,
        task_kwargs=cfg.task_kwargs,  # eval.problem_seed included: the train stream may avoid that eval set
        engine=cfg.engine.name,
        numerics=cfg.engine.numerics,
        engine_kwargs=dict(cfg.engine.kwargs),
        capture_routing=True if cfg.r3 else None,
        threads=cfg.engine.threads,
        sampling=sampling_params(cfg),
        prompts_per_batch=cfg.train.prompts_per_batch,
        group_size=cfg.train.group_size,
        seed=cfg.seed,
    )


def build_run_dir(cfg: RunConfig, resume: bool = False) -> RunDir:
    return RunDir(
        cfg.run_dir(),
        cfg.model_dump(mode="json"),
        collapse=cfg.collapse,
        warmup_steps=cfg.steps_per_batch,
        resume=resume,
    )


def eval_engine_kwargs(cfg: RunConfig) -> dict:
    """The evaluation engine's extra arguments: ``eval.engine_kwargs`` where given, else the rollout engine's own
    when evaluation uses the same engine (its options mean the same there), else none."""
    if cfg.eval.engine_kwargs is not None:
        return dict(cfg.eval.engine_kwargs)
    return dict(cfg.engine.kwargs) if (cfg.eval.engine or cfg.engine.name) == cfg.engine.name else {}


def build_evaluator(cfg: RunConfig, tokenizer, task) -> Evaluator:
    e = cfg.eval
    engine = EvalEngineSpec(e.engine or cfg.engine.name, eval_engine_kwargs(cfg), cfg.model.source, cfg.engine.numerics)
    plan = EvalPlan(sampling=sampling_params(cfg), k=e.k, seed=cfg.seed, every=e.every, at_start=e.at_start,
                    val_problems=e.val_problems, test_problems=e.test_problems)  # fmt: skip
    return Evaluator(tokenizer, task, engine, plan)


def backend_options(cfg: RunConfig) -> dict:
    """Keyword arguments of the chosen backend beyond the worker spec: the engine's deadlines and restarts
    (``local``), the ``ray:`` section and the rollout deadline (``ray``), none for ``sequential`` (its engine runs
    in this process, which cannot restart itself)."""
    e = cfg.engine
    if cfg.backend == "local":
        return {"timeout_s": e.timeout_s, "start_timeout_s": e.start_timeout_s, "max_restarts": e.max_restarts,
                "transport": cfg.weights.transport, "bucket_bytes": cfg.weights.bucket_mb * 2**20}  # fmt: skip
    if cfg.backend == "ray":
        return {"num_workers": cfg.ray.workers, "address": cfg.ray.address, "num_gpus": cfg.ray.gpus,
                "timeout_s": e.timeout_s, "max_hang_restarts": e.max_restarts}  # fmt: skip
    return {}


def snapshot_weights(cfg: RunConfig, trainer) -> Callable[[], dict]:
    """The weights the snapshot store keeps per version (``pipeline.weights.snapshot_source``)."""
    from satrl.engines.torch_engine import resolve_numerics
    from satrl.pipeline.weights import snapshot_source

    dtype = resolve_numerics(cfg.engine.numerics).weights
    return snapshot_source(trainer, cfg.weights.transport, dtype, cfg.weights.bucket_mb * 2**20, cfg.diagnostics.decompose)


def check_context(cfg: RunConfig, model, tokenizer, problems) -> None:
    """Refuse up front (one line naming ``engine.max_new_tokens``) a run whose prompts plus ``max_new_tokens``
    cannot fit the policy's context; checked on ``problems`` (the eval set and the first train batch), so it
    fails before any engine starts instead of in the middle of generation. A longer prompt met later still
    stops the run with one line (:class:`~satrl.types.ContextLengthError` from the engine)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not limit:
        return
    longest = max((len(tokenizer(p.prompt)["input_ids"]) for p in problems), default=1)
    need = longest + cfg.engine.max_new_tokens
    if longest >= limit:  # no max_new_tokens fits: the prompts are the problem
        raise ConfigError(
            f"the longest prompt checked is {longest} tokens, as long as or longer than the context of "
            f"{cfg.model.source} (max_position_embeddings={limit}); shorten the task's prompts (or drop those rows)"
        )
    if need > limit:
        raise ConfigError(
            f"engine.max_new_tokens={cfg.engine.max_new_tokens}: with the longest prompt checked ({longest} tokens) "
            f"that is {need} tokens, beyond the context of {cfg.model.source} (max_position_embeddings={limit}); "
            f"lower engine.max_new_tokens to at most {limit - longest}"
        )


def trainer_settings(cfg: RunConfig) -> TrainerSettings:
    """The trainer's options from the run's config: the one place the sections map onto it."""
    t = cfg.train
    return TrainerSettings(
        lr=t.lr,
        aggregation=cfg.objective.aggregation,
        betas=tuple(t.betas),
        weight_decay=t.weight_decay,
        grad_clip=t.grad_clip,
        temperature=cfg.engine.temperature,
        microbatch_tokens=t.microbatch_tokens,
        whole_batch_quantile=t.quantile_scope == "batch",
        r3=cfg.r3,
        recomputed_denominator=t.denominator == "recomputed",
        device=t.device,
        minibatches=t.minibatches,
        ppo_epochs=t.ppo_epochs,
        adv_std_norm=t.adv_std_norm,
        decompose=cfg.diagnostics.decompose,
        seed=cfg.seed,
        dtype=t.dtype,
        tf32=t.tf32,
        activation_checkpointing=t.activation_checkpointing,
        logprob_chunk_tokens=t.logprob_chunk_tokens,
        lr_lag_scaling=t.lr_lag_scaling,
        microbatch_order=t.microbatch_order,
        compile=t.compile,
    )


def build_trainer(cfg: RunConfig) -> tuple[Trainer, object]:
    """The policy (fp32 master weights) and its trainer; returns ``(trainer, tokenizer)``. Under data parallel only
    rank 0 reads the weights (:func:`~satrl.pipeline.data_parallel.load_policy_here`)."""
    model, tokenizer = load_policy_here(cfg)
    if cfg.r3:
        from satrl.models.routing import moe_num_layers

        if moe_num_layers(model) == 0:
            raise ValueError(f"r3=true needs an MoE policy; {cfg.model.source!r} is dense (try model.name=tiny-arith-moe)")
    make, extra = trainer_factory(cfg)  # Trainer, or the data-parallel one under torchrun
    trainer = make(model, cfg.objective, trainer_settings(cfg), **extra)
    return trainer, tokenizer
