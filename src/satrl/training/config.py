"""The ``train:`` section of the run config: the optimizer, the batch and its cut into microbatches, precision
and memory. :meth:`TrainerSettings.from_config <satrl.training.settings.TrainerSettings.from_config>` maps it onto
:class:`~satrl.training.settings.TrainerSettings`; the trainer itself never sees it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny, field_validator, model_validator

from satrl.config_base import Device, Section
from satrl.objectives.registry import Params
from satrl.training.baselines import ADVANTAGES, DEFAULT_ADVANTAGE, resolve_advantage

# The most samples one rollout batch may hold (train.prompts_per_batch x train.group_size): 2^20, ~100x the largest
# published RL batches; beyond, allocating the batch (and the first batch's problems) is what runs, for minutes.
MAX_BATCH_SAMPLES = 2**20
# The largest learning rate train.lr (and `satrl pretrain --lr`) takes: beyond, AdamW's first step wrecks the weights.
MAX_LR = 1.0


class TrainConfig(Section):
    lr: float = Field(1e-4, gt=0, le=MAX_LR, description="Constant learning rate, in (0, 1] (beyond, AdamW's first step "
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
        8, le=MAX_BATCH_SAMPLES, description="Samples per prompt (GRPO group), in [2, 2^20]: every advantage "
        "estimator (GRPO's, VCPO's OPOB) centres a reward on its group's, so a group of 1 has advantage 0 and learns "
        "nothing; see prompts_per_batch for the bound on their product.",
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
    adv_std_norm: bool = Field(True, description="Divide the advantages by the group's reward std + 1e-6 (GRPO); "
                               "false: Dr. GRPO's unscaled advantages. Applies to every train.advantage baseline.")
    advantage: Annotated[SerializeAsAny[Params], BeforeValidator(resolve_advantage)] = Field(
        default=DEFAULT_ADVANTAGE,
        description=f"The advantage baseline, by name with its parameters ({', '.join(ADVANTAGES.names())}; "
        "satrl.training.baselines): group_mean is GRPO's; e.g. train.advantage=rloo, or train.advantage.name="
        "constant_offset train.advantage.c=0.5. An objective that brings its own (vcpo's baseline=opob) needs "
        "group_mean here.",
    )  # fmt: skip
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

    @field_validator("group_size")
    @classmethod
    def _group_of_two(cls, n: int) -> int:  # issue 60: group_size=1 ran with loss and gradient 0.0 every step
        if n < 2:
            raise ValueError(f"got {n}; at least 2: the advantage is each reward minus its group's mean, so a group "
                             "of fewer than 2 samples has advantage 0 and learns nothing")  # fmt: skip
        return n

    @model_validator(mode="after")
    def _batch_fits(self) -> TrainConfig:  # issue 46: prompts_per_batch=1e9 printed nothing for minutes
        if (n := self.prompts_per_batch * self.group_size) > MAX_BATCH_SAMPLES:
            raise ValueError(f"train.prompts_per_batch={self.prompts_per_batch} x train.group_size={self.group_size} "
                             f"= {n:,} samples per rollout batch, beyond the most, 2^20 = {MAX_BATCH_SAMPLES:,}")  # fmt: skip
        return self
