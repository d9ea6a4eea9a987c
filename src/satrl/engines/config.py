"""The ``engine:`` section of the run config: which engine (:data:`satrl.engines.ENGINES`), its numerics
(:data:`satrl.engines.NUMERICS`), sampling, extra arguments and deadlines. A name is checked against its registry
when the config loads, so an engine registered before is valid at once."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from satrl.config_base import Section
from satrl.engines.numerics import DEFAULT_NUMERICS, NUMERICS
from satrl.engines.registry import ENGINES
from satrl.types import ENGINE_TIMEOUT_S

# Config fields that name a registered choice (the registry is the only list of valid names).
EngineName = Annotated[str, AfterValidator(ENGINES.check)]
NumericsName = Annotated[str, AfterValidator(NUMERICS.check)]


class EngineConfig(Section):
    name: EngineName = Field("torch", description="Engine: a name in satrl.engines.ENGINES (torch; vllm with the extra).")
    numerics: NumericsName = Field(
        DEFAULT_NUMERICS, description="Engine numerics (satrl.engines.NUMERICS); differs from the fp32 trainer so "
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
