"""How a :class:`~satrl.training.trainer.Trainer` trains: one typed, frozen object instead of two dozen keyword
arguments. The run's config sections (``train``, ``objective.aggregation``, ``engine.temperature``, ``r3``,
``diagnostics.decompose``, ``seed``) map onto it in one place, :func:`satrl.pipeline.launch.setup.trainer_settings`; tests
and benchmarks build it directly. The trainer never sees the config classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from satrl.dtypes import CONFIG_DTYPES
from satrl.objectives.step_size import LAG_SCALINGS

MICROBATCH_ORDERS = ("shuffled", "by_length")


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
    """

    lr: float
    aggregation: str = "token-mean"
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    temperature: float = 1.0
    microbatch_tokens: int = 4096
    whole_batch_quantile: bool = False
    r3: bool = False
    recomputed_denominator: bool = False
    device: str | torch.device = "cpu"
    minibatches: int = 1
    ppo_epochs: int = 1
    adv_std_norm: bool = True
    advantage: Any = "group_mean"
    decompose: bool = False
    seed: int = 0
    dtype: str = "fp32"
    activation_checkpointing: bool = False
    logprob_chunk_tokens: int | str = 0
    lr_lag_scaling: str = "none"
    microbatch_order: str = "shuffled"
    compile: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("dtype", CONFIG_DTYPES), ("microbatch_order", MICROBATCH_ORDERS),
                              ("lr_lag_scaling", LAG_SCALINGS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
