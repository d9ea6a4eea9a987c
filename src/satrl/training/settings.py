"""How a :class:`~satrl.training.trainer.Trainer` trains: one typed, frozen object instead of two dozen keyword
arguments. Tests and benchmarks build it directly; a run builds it from its config in one place,
:meth:`TrainerSettings.from_config`. The trainer never sees the config classes.

The options it shares with the ``train:`` section (:data:`SHARED`) are derived from
:class:`~satrl.training.config.TrainConfig`: their defaults are read from it (never kept equal by hand) and
``from_config`` copies them by name; tests/training/test_settings.py checks names, types and defaults agree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from satrl.dtypes import CONFIG_DTYPES
from satrl.objectives.step_size import LAG_SCALINGS
from satrl.training.config import TrainConfig

MICROBATCH_ORDERS = ("shuffled", "by_length")


def _train(name: str) -> Any:
    """The ``train.<name>`` default: the one copy of a shared option's default."""
    return TrainConfig.model_fields[name].default


@dataclass(frozen=True)
class TrainerSettings:
    """Every option of the trainer; the defaults are the config's.

    Attributes:
        lr: AdamW's base learning rate (``train.lr``); the step-size seam scales it per step.
        aggregation: how token losses become one number (``objective.aggregation``).
        betas, weight_decay: AdamW's (``train.betas``, ``train.weight_decay``).
        grad_clip: gradient-norm clip, None for none (``train.grad_clip``).
        temperature: the sampling temperature, so that pi's log-probs match mu's (``engine.temperature``).
        microbatch_tokens: token budget per microbatch (``train.microbatch_tokens``); SAT's quantile is per microbatch.
        whole_batch_quantile: run each minibatch as one microbatch (``train.quantile_scope=batch``).
        r3: replay the engine's MoE routing in the trainer's forward (``r3``).
        recomputed_denominator: pi_old from the trainer at the batch's start (``train.denominator=recomputed``).
        device: where the trainer computes (``train.device``).
        minibatches, ppo_epochs: one rollout batch is ``ppo_epochs`` passes of ``minibatches`` optimizer steps.
        adv_std_norm: divide group advantages by the group std (``train.adv_std_norm``).
        advantage: the advantage baseline (``train.advantage``): a name, a mapping with one, or its resolved
            parameters (:func:`satrl.training.baselines.resolve_advantage`); ``group_mean`` is GRPO's.
        decompose: split d into policy lag and implementation mismatch (``diagnostics.decompose``; extra forward).
        seed: the minibatch shuffles' seed (``seed``).
        dtype: ``fp32`` or ``bf16`` compute; master weights and AdamW state stay fp32 (``train.dtype``).
        activation_checkpointing: recompute each decoder layer in the backward (``train.activation_checkpointing``).
        logprob_chunk_tokens: tokens per log-prob chunk, 0 for none, ``auto`` (``train.logprob_chunk_tokens``).
        lr_lag_scaling: scale each step's lr by realized lag (``train.lr_lag_scaling``).
        microbatch_order: ``shuffled`` or ``by_length`` (``train.microbatch_order``).
        compile: decoder layers and the log-prob chunk through torch.compile (``train.compile``).
        snapshot_cut: what the snapshot store keeps of a version (``WeightExport.snapshot``): None, the full fp32
            CPU copy; ``(dtype, bucket_bytes)``, the bucket stream in the engine's dtype. The run derives it from
            its transport and engine (:func:`satrl.launch.setup.snapshot_cut`).
    """

    lr: float  # required here (a test names its own); the config's default is train.lr's
    aggregation: str = "token-mean"
    betas: tuple[float, float] = _train("betas")
    weight_decay: float = _train("weight_decay")
    grad_clip: float | None = _train("grad_clip")
    temperature: float = 1.0
    microbatch_tokens: int = _train("microbatch_tokens")
    whole_batch_quantile: bool = _train("quantile_scope") == "batch"
    r3: bool = False
    recomputed_denominator: bool = _train("denominator") == "recomputed"
    device: str | torch.device = _train("device")
    minibatches: int = _train("minibatches")
    ppo_epochs: int = _train("ppo_epochs")
    adv_std_norm: bool = _train("adv_std_norm")
    advantage: Any = _train("advantage")
    decompose: bool = False
    seed: int = 0
    dtype: str = _train("dtype")
    activation_checkpointing: bool = _train("activation_checkpointing")
    logprob_chunk_tokens: int | str = _train("logprob_chunk_tokens")
    lr_lag_scaling: str = _train("lr_lag_scaling")
    microbatch_order: str = _train("microbatch_order")
    compile: bool = _train("compile")
    snapshot_cut: tuple[torch.dtype | None, int] | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("dtype", CONFIG_DTYPES), ("microbatch_order", MICROBATCH_ORDERS),
                              ("lr_lag_scaling", LAG_SCALINGS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")

    @classmethod
    def from_config(cls, train: TrainConfig, *, aggregation: str, temperature: float, r3: bool, decompose: bool,
                    seed: int, snapshot_cut: tuple[torch.dtype | None, int] | None = None) -> TrainerSettings:  # fmt: skip
        """The run's settings: every :data:`SHARED` option copied from ``train`` by name, the two the trainer
        reads as flags from the ``train`` choices they stand for, the five that live in other sections
        (``objective.aggregation``, ``engine.temperature``, ``r3``, ``diagnostics.decompose``, ``seed``), and the
        snapshot store's form, which the run derives from its transport and engine."""
        shared = {name: getattr(train, name) for name in SHARED}
        shared["betas"] = tuple(train.betas)
        return cls(**shared, whole_batch_quantile=train.quantile_scope == "batch",
                   recomputed_denominator=train.denominator == "recomputed", aggregation=aggregation,
                   temperature=temperature, r3=r3, decompose=decompose, seed=seed, snapshot_cut=snapshot_cut)  # fmt: skip


# The options named alike in TrainerSettings and TrainConfig: copied by name, defaults read from the config.
SHARED = tuple(f.name for f in fields(TrainerSettings) if f.name in TrainConfig.model_fields)
