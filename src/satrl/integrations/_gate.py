"""When SAT's gate cannot fire for a loss call's composition (shared by the verl and TRL plug-ins).

Frameworks call a policy loss once per micro-batch (and rank), so SAT's quantile (paper Eq. 14) is over
that call's n active tokens. The gate picks at most m = n - ceil(alpha * n) of them. A sequence-level gate
(GSPO's score is the sequence's, on every token) moves whole sequences, so it can gate nothing when every
sequence is longer than m: with alpha = 0.9, when each sequence holds more than 10 % of the call's tokens.
The plug-ins warn once per process when that happens. See docs/integrations.md.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from satrl.objectives.sat import quantile_rank

_warned_gate: list[str] = []  # what was warned about in this process (at most one entry)


@torch.no_grad()
def composition(mask: Tensor) -> dict[str, Tensor]:
    """What :func:`gate_capacity` needs of one call's mask [B, T]: active tokens n and the shortest
    non-empty sequence's length (0-dim tensors, to be synced with the caller's metrics)."""
    lengths = mask.bool().sum(dim=-1)  # [B]
    n = lengths.sum()
    shortest = torch.where(lengths > 0, lengths, n).min() if lengths.numel() else n
    return {"n": n, "shortest": shortest}


def gate_capacity(n: int, shortest: int, alpha: float, per_sequence: bool) -> int | None:
    """The gate's budget m = n - ceil(alpha * n) when the call's composition rules the gate out, else None.

    The gate picks at most m of the call's n active tokens (strict inequality against the
    ceil(alpha*n)-th smallest score, paper Eq. 14). A token-level gate needs m >= 1; a sequence-level gate
    moves whole sequences (every token carries its sequence's score), so it needs a sequence of at most m
    tokens: with alpha = 0.9 one whose tokens are at most 10 % of the call's. The inverted gate has the
    same budget. alpha = 1 (gate off on purpose) never counts as ruled out.
    """
    if alpha >= 1.0 or n == 0:
        return None
    m = n - quantile_rank(alpha, n)
    unit = shortest if per_sequence else 1
    return m if m < unit else None


def warn_gate_cannot_fire(what: str, n: int, shortest: int, m: int, alpha: float, per_sequence: bool,
                          hint: str) -> None:
    """Warn (RuntimeWarning, once per process) that ``what``'s gate cannot fire; ``hint`` says how to fix it."""
    if _warned_gate:
        return
    _warned_gate.append(what)
    unit = f"the shortest sequence ({shortest} tokens)" if per_sequence else "one token"
    warnings.warn(
        f"satrl {what}: SAT's gate cannot fire in this micro-batch: it gates at most "
        f"n - ceil(alpha*n) = {m} of its n = {n} tokens (sat_alpha={alpha}), fewer than {unit}, so the loss "
        f"is the base clip. The quantile is per loss call (micro-batch and rank): {hint}; "
        "see docs/integrations.md. Warned once per process.",
        RuntimeWarning,
        stacklevel=4,
    )
