"""What satrl gives every engine it builds, as one typed argument: :class:`EngineSpec`.

An engine's constructor takes what it runs (a model, or a checkpoint's path), an :class:`EngineSpec`, and its own
extras (``engine.kwargs``: the torch engine's ``device`` and ``max_batch_size``, vLLM's own arguments).
:func:`split_spec` sorts a builder's flat keyword arguments (:func:`satrl.engines.registry.make_engine`'s) into
the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EngineSpec:
    """The settings every engine takes, whatever its name.

    Attributes:
        eos_token_id: id or ids that stop a response (kept as its last token); None: stop on length only.
        pad_token_id: id fed for left padding (never attended to); the torch engine needs one, vLLM (no padding)
            ignores it.
        tokenizer: decodes ``Completion.text`` (special tokens removed); None gives "".
        numerics: "fp32" | "bf16" | "bf16-weights" (:mod:`satrl.engines.numerics`); None: the engine's own default
            (the torch engine's ``bf16-weights``, vLLM's ``fp32``).
        capture_routing: record MoE routing per token; None = auto (on for MoE models the engine can capture).
        version: initial policy version.
    """

    eos_token_id: int | Sequence[int] | None
    pad_token_id: int | None = None
    tokenizer: Any = None
    numerics: str | None = None
    capture_routing: bool | None = None
    version: int = 0


SPEC_FIELDS = frozenset(f.name for f in fields(EngineSpec))


def split_spec(kwargs: dict[str, Any]) -> tuple[EngineSpec, dict[str, Any]]:
    """``(EngineSpec of the keys it has, the other keys)``: an engine builder's flat keyword arguments as its
    constructor takes them."""
    spec = EngineSpec(**{k: v for k, v in kwargs.items() if k in SPEC_FIELDS})
    return spec, {k: v for k, v in kwargs.items() if k not in SPEC_FIELDS}
