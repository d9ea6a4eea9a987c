"""Shared data types: what flows between the task, the engine, the buffer and the trainer.

Staleness is explicit data: every :class:`Completion` and :class:`Sample` carries the policy ``version``
that produced it, its ``behavior_logp`` and (for MoE models) its ``routing``. Shapes are given as
``# [T]`` comments, with T the number of response tokens. See docs/design.md ("One sample, from task to metrics", "Glossary").
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only (strings here): a config is checked without importing torch
    import torch

# The default of engine.timeout_s and engine.start_timeout_s, and of every constructor that takes them: how long
# an engine may work without returning a rollout (or take to start) before it counts as hung. One constant, so
# the config's default and a backend built without a config agree.
ENGINE_TIMEOUT_S = 1800.0


Prompt = str | tuple[dict[str, str], ...]  # a string or chat messages (see Problem); checked by check_messages


@dataclass(frozen=True)
class Problem:
    """One task instance: a prompt and its reference answer. The prompt is a string, or chat messages (a tuple
    of ``{"role": ..., "content": ...}`` dicts, as TRL and verl take a conversational prompt), which the
    tokenizer's chat template renders (:mod:`satrl.models.chat`)."""

    id: str
    prompt: Prompt
    answer: str


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Any) -> tuple[dict[str, str], ...]:
    """``messages`` as a tuple of ``{"role", "content"}`` dicts of strings, or ``ValueError`` (one line) naming
    the first message that is not one: a non-empty list, each role one of :data:`ROLES`."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ValueError(f"chat messages must be a non-empty list of {{role, content}} objects, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str)):
            raise ValueError(f"chat message {i} must be an object with exactly the string keys role and content, got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ValueError(f"chat message {i}: role {m['role']!r:.40}; valid choices: {', '.join(ROLES)}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def prompt_text(prompt: Prompt) -> str:
    """One string per prompt, for hashing it into a split: a string as it is (every split of a string task stays
    what it was), messages as canonical JSON."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([dict(m) for m in prompt], ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def request_seed(stream: str, seed: int, *index: int) -> int:
    """The sampling seed of one generation request: a pure function of the run ``seed`` and the request's
    place, so samples never depend on timing, batching or which process generates them.

    Streams: ``"rollout"``, index ``(b, g, i)`` = batch, prompt group, sample (62 bits); ``"eval"``, index
    ``(i, j)`` = problem, sample, ``j = -1`` the greedy request (63 bits). The two streams hash differently,
    as they did before they shared this function, so every recorded run replays bit for bit.
    """
    if stream == "rollout":
        b, g, i = index
        return random.Random(f"rollout-{seed}-{b}-{g}-{i}").getrandbits(62)
    if stream == "eval":
        i, j = index
        return int.from_bytes(hashlib.blake2b(f"{seed}/{i}/{j}".encode(), digest_size=8).digest(), "big") >> 1
    raise ValueError(f"unknown request-seed stream {stream!r}; valid choices: ['eval', 'rollout']")


@dataclass(frozen=True)
class SamplingParams:
    """How the engine samples. Defaults follow the paper's Appendix F: full-vocabulary support."""

    temperature: float = 1.0
    top_p: float = 1.0  # 1.0 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 16
    greedy: bool = False  # argmax decoding; behavior_logp is then the temperature-scaled log-prob

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete. ``seed`` fixes the sampling noise of this request alone, so the result
    does not depend on which other requests share its batch."""

    request_id: str
    prompt_ids: list[int]
    seed: int


@dataclass
class Completion:
    """What the engine returns for one request."""

    request_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    text: str  # decoded response, special tokens removed
    behavior_logp: torch.Tensor  # [T] float32, log mu(y_t | s_t) under the sampling distribution
    finish_reason: str  # "stop" (EOS) or "length"
    version: int  # policy version of the weights that generated it (its first token, under in-flight updates)
    routing: torch.Tensor | None = None  # [T, layers, top_k] int64 experts used, MoE models only
    token_versions: torch.Tensor | None = None  # [T] int64 version per token; None: all ``version``


@dataclass
class Sample:
    """A scored completion, ready for the buffer. ``group_id`` ties the G samples of one prompt."""

    id: str
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logp: torch.Tensor  # [T]
    version: int  # the version of the first token (the oldest): drops and held counts read it
    reward: float
    routing: torch.Tensor | None = None  # [T, layers, top_k]
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. {"reward_timeout": True}
    # [T] int64 version that sampled each token, when in-flight updates switched weights mid-response
    # (``lag.inflight_every``); None: every token is ``version`` (and old checkpoints, which lack the field)
    token_versions: torch.Tensor | None = None

    def versions(self) -> torch.Tensor:  # [T] int64
        if self.token_versions is None:
            import torch

            return torch.full((len(self.response_ids),), self.version, dtype=torch.long)
        return self.token_versions.long()


@dataclass
class Batch:
    """Padded tensors for one trainer step. Row b is prompt + response, right-padded to L.

    Response token t of row b sits at ``input_ids[b, prompt_len[b] + t]``; its log-prob comes from the
    logits at position ``prompt_len[b] + t - 1``.
    """

    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L] bool
    prompt_len: torch.Tensor  # [B] int64
    mask: torch.Tensor  # [B, T] bool, active response tokens
    response_ids: torch.Tensor  # [B, T] int64 (0 where ~mask)
    behavior_logp: torch.Tensor  # [B, T] float32 (0 where ~mask)
    versions: torch.Tensor  # [B, T] int64 policy version per token
    rewards: torch.Tensor  # [B] float32
    group_index: torch.Tensor  # [B] int64, samples sharing a prompt share an index
    routing: torch.Tensor | None = None  # [B, L, layers, top_k] int64, -1 where unknown
    sample_ids: list[str] = field(default_factory=list)


@runtime_checkable
class Task(Protocol):
    """A verifiable task: problems for a split and seed, and a 0/1 reward."""

    name: str

    def problems(self, split: str, seed: int) -> Iterator[Problem]: ...

    def reward(self, problem: Problem, completion_text: str) -> float: ...


@dataclass(frozen=True)
class Score:
    """A graded answer: its reward, and whether grading hit the task's time limit (the reward is then 0)."""

    reward: float
    timed_out: bool = False


@runtime_checkable
class ScoringTask(Protocol):
    """A task whose grader can run out of time says so per answer (``satrl.tasks.jsonl_math``); the rollout
    worker records it on the sample (``meta["reward_timeout"]``), the loop counts it (``reward/timeouts``)."""

    def score(self, problem: Problem, completion_text: str) -> Score: ...


@runtime_checkable
class SkipsRows(Protocol):
    """A task that skips malformed dataset rows lists them, ``(line, why)``; the run summary counts them."""

    skipped: list[tuple[int, str]]


@runtime_checkable
class Engine(Protocol):
    """A rollout engine. It learns about new weights only through ``load_weights``."""

    @property
    def version(self) -> int: ...

    def generate(
        self, requests: list[GenerationRequest], sampling: SamplingParams, switch: Switch | None = None
    ) -> list[Completion]:
        """Complete every request (result i answers ``requests[i]``). ``switch``: in-flight weight updates, given
        only to an engine whose builder declares ``inflight = True`` (``engines.registry.engines_declaring``)."""

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...


@dataclass(frozen=True)
class Switch:
    """In-flight weight updates (``lag.inflight_every``): ``switch(t)`` puts the engine on the version the schedule
    fixes for decode step t. That version changes only at multiples of ``every`` (K), so an engine that cannot
    switch between two tokens (vLLM) may generate K tokens per call and switch in between."""

    every: int
    use: Callable[[int], None]

    def __call__(self, t: int) -> None:
        self.use(t)


@runtime_checkable
class TransferEngine(Protocol):
    """An engine that takes versions through its own weight-transfer API (vLLM's, ``weights.transport=vllm``):
    it joins the trainer's group once, then loads each version the trainer broadcast there. It holds one
    version only: the one it loaded last."""

    def open_transfer(self, port: int, prefix: str, host: str = "127.0.0.1") -> None: ...

    def receive_weights(self, version: int) -> None: ...


@runtime_checkable
class Closable(Protocol):
    """An engine with processes of its own (vLLM) stops them in ``close``; the torch engine has none."""

    def close(self) -> None: ...


@runtime_checkable
class TrainerLike(Protocol):
    """What the pipeline reads of a trainer (``satrl.training.trainer.Trainer``, on any placement): the
    policy ``model``, its ``version`` (optimizer-step slots), a CPU copy of its ``weights``, the state a checkpoint
    saves besides them, and ``train_batch``, which trains one rollout batch and yields ``(metrics, rows)`` after
    each optimizer step. ``snapshots(v)`` gives the kept weights of version v (the Δπ/Δimpl split)."""

    model: torch.nn.Module
    version: int

    def weights(self) -> dict[str, torch.Tensor]: ...

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def write_shards(self, path: Path | None) -> None: ...

    def read_shards(self, path: Path | None) -> None: ...

    def engine_model(self) -> torch.nn.Module: ...

    def train_batch(
        self, batch: Batch, index: int, snapshots: Callable[[int], dict[str, torch.Tensor] | None], stop_at: int
    ) -> Iterator[tuple[dict[str, float], torch.Tensor]]: ...


class ContextLengthError(ValueError):
    """A prompt plus ``engine.max_new_tokens`` longer than the model's context: bad input, one line for the user."""
