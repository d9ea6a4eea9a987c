"""Turn a :class:`~satrl.config.RunConfig` into plain-argument components (the config stops here)."""

from __future__ import annotations

from dataclasses import replace

import torch

from satrl.config.run import RunConfig
from satrl.config_base import ConfigError
from satrl.diagnostics.summary import late_window_start
from satrl.launch.data_parallel import OneProcess, Ranks
from satrl.launch.stand_ins import NoEvaluator, NoRunDir
from satrl.pipeline.engines_host.worker import WorkerSpec
from satrl.pipeline.evaluator import EvalEngineSpec, EvalPlan, Evaluator
from satrl.rundir.files import RunDir
from satrl.training import dp
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer
from satrl.types import SamplingParams
from satrl.weights.transports import TRANSPORTS


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
        chat=cfg.model.chat_format(),
    )


def build_run_dir(cfg: RunConfig, resume: bool = False, ranks: Ranks | None = None) -> RunDir | NoRunDir:
    """The run directory: rank 0's (or the one process's), a stand-in on the other data-parallel ranks."""
    ranks = OneProcess() if ranks is None else ranks
    if not ranks.rank0:
        return NoRunDir(ranks)
    return RunDir(
        cfg.run_dir(),
        cfg.model_dump(mode="json"),
        collapse=cfg.collapse,
        warmup_steps=cfg.steps_per_batch,
        resume=resume,
        data_parallel=ranks.ctx is not None,
    )


def eval_engine_kwargs(cfg: RunConfig) -> dict:
    """The evaluation engine's extra arguments: ``eval.engine_kwargs`` where given, else the rollout engine's own
    when evaluation uses the same engine (its options mean the same there), else none."""
    if cfg.eval.engine_kwargs is not None:
        return dict(cfg.eval.engine_kwargs)
    return dict(cfg.engine.kwargs) if (cfg.eval.engine or cfg.engine.name) == cfg.engine.name else {}


def build_evaluator(cfg: RunConfig, tokenizer, task, ranks: Ranks | None = None) -> Evaluator | NoEvaluator:
    """The evaluator: rank 0's (or the one process's), a stand-in on the other data-parallel ranks."""
    if ranks is not None and not ranks.rank0:
        return NoEvaluator()
    e = cfg.eval
    engine = EvalEngineSpec(e.engine or cfg.engine.name, eval_engine_kwargs(cfg), cfg.model.source, cfg.engine.numerics)
    plan = EvalPlan(sampling=sampling_params(cfg), k=e.k, seed=cfg.seed, every=e.every, at_start=e.at_start,
                    val_problems=e.val_problems, test_problems=e.test_problems, chat=cfg.model.chat_format(),
                    late_test_problems=e.late_test_problems, late_from=late_window_start(cfg.steps))  # fmt: skip
    return Evaluator(tokenizer, task, engine, plan)


def snapshot_cut(cfg: RunConfig) -> tuple[torch.dtype | None, int] | None:
    """What the snapshot store keeps of a version that pending batches need (``WeightExport.snapshot``, set once
    by :func:`trainer_settings`): None, the trainer's full fp32 CPU copy (``WeightExport.weights``), when the
    transport sends it as it is (its ``full_snapshots``), and whenever the Δπ/Δimpl split
    (``diagnostics.decompose``) reads it, since its log-probs must be today's; otherwise ``(dtype, bucket_bytes)``:
    the trainer's bucket stream (``WeightExport.buckets``) in the engine's dtype, kept as it came (a broadcast
    sends those very buckets; a checkpoint unpacks them, once), never an fp32 copy on one device (under data
    parallel the buckets are cut from the fp32 copy every rank gathered at the sync point before:
    ``satrl.launch.data_parallel``). The engine rounds to that dtype anyway, so it generates with the same weights
    either way."""
    from satrl.engines.numerics import resolve_numerics

    if TRANSPORTS.get(cfg.weights.transport).full_snapshots or cfg.diagnostics.decompose:
        return None
    return resolve_numerics(cfg.engine.numerics).weights, cfg.weights.bucket_mb * 2**20


def check_snapshots(snapshots: dict[int, dict[str, torch.Tensor]], decompose: bool) -> None:
    """Refuse (one line) to resume with ``diagnostics.decompose`` on from a checkpoint whose kept snapshots are
    engine-dtype copies (written by a ``dist`` run without it): the split needs the exact fp32 weights."""
    low = sorted(v for v, s in snapshots.items() if any(t.dtype != torch.float32 for t in s.values() if t.is_floating_point()))
    if decompose and low:
        raise ConfigError(f"diagnostics.decompose=true: the checkpoint keeps versions {low} in the engine's dtype only "
                         f"(saved by a weights.transport=dist run without it); resume with diagnostics.decompose=false")  # fmt: skip


def check_context(cfg: RunConfig, model, tokenizer, problems) -> None:
    """Refuse up front (one line naming ``engine.max_new_tokens``) a run whose prompts plus ``max_new_tokens``
    cannot fit the policy's context, or whose prompts cannot be encoded (``model.chat``: no chat template); checked
    on ``problems`` (the eval set and the first train batch), so it fails before any engine starts instead of in the middle of generation. A longer prompt met later still
    stops the run with one line (:class:`~satrl.types.ContextLengthError` from the engine)."""
    from satrl.models.chat import ChatTemplateError, encode_prompt

    fmt = cfg.model.chat_format()
    try:  # every checked prompt encodes as the engines will encode it: a missing chat template fails here
        lengths = [len(encode_prompt(tokenizer, p.prompt, fmt)) for p in problems]
    except ChatTemplateError as err:
        raise ConfigError(str(err)) from None
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not limit:
        return
    longest = max(lengths, default=1)
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
    """The trainer's options from the run's config (:meth:`TrainerSettings.from_config`, the one place they map)."""
    return TrainerSettings.from_config(cfg.train, aggregation=cfg.objective.aggregation, temperature=cfg.engine.temperature,
                                       r3=cfg.r3, decompose=cfg.diagnostics.decompose, seed=cfg.seed,
                                       snapshot_cut=snapshot_cut(cfg))  # fmt: skip


def build_trainer(cfg: RunConfig, ctx: dp.DataParallel | None = None) -> tuple[Trainer, object]:
    """The policy (fp32 master weights) and its trainer; returns ``(trainer, tokenizer)``. Under data parallel
    (``ctx``: this process's place in the job) every rank builds it, together (its placement shards the policy over
    the ranks: :func:`placement_here`); only rank 0 reads the weights (:func:`load_policy_here`)."""
    model, tokenizer = load_policy_here(cfg, ctx)
    if cfg.r3:
        from satrl.models.routing import moe_num_layers

        if moe_num_layers(model) == 0:
            raise ValueError(f"r3=true needs an MoE policy; {cfg.model.source!r} is dense (try model.name=tiny-arith-moe)")
    settings, placement = placement_here(cfg, trainer_settings(cfg), ctx)
    trainer = Trainer(model, cfg.objective, settings, placement)
    return trainer, tokenizer


def placement_here(cfg: RunConfig, settings: TrainerSettings, ctx: dp.DataParallel | None) -> tuple[TrainerSettings, object]:
    """Where this process's trainer keeps the weights: the whole policy on ``train.device`` (None: the trainer's
    default), or, under data parallel, FSDP2 shards on this rank's device, with a way to build an unsharded copy
    of the policy for an engine (:class:`~satrl.training.sharded.Sharded`)."""
    if ctx is None:
        return settings, None
    from satrl.models import load_policy
    from satrl.training.sharded import Sharded

    return replace(settings, device=ctx.device), Sharded(ctx, lambda: load_policy(cfg.model.source)[0])


def load_policy_here(cfg: RunConfig, ctx: dp.DataParallel | None):
    """``(model, tokenizer)`` for this process: the loaded policy on one device and on rank 0; on the other
    ranks of a data-parallel job, the architecture on the meta device (no weights read: the trainer fills
    their shards from rank 0's, so only rank 0's host ever holds the full weights)."""
    from satrl.models import empty_model, load_policy, load_tokenizer

    if ctx is None or ctx.leader:
        return load_policy(cfg.model.source)
    return empty_model(cfg.model.source), load_tokenizer(cfg.model.source)
