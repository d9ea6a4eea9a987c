"""Where SAT's μ came from: the one vocabulary of the plug-ins (verl, TRL), a leaf both import.

SAT gates on d = log π/μ, and μ is the rollout engine's policy (the log-probs of the tokens as the engine sampled
them). A framework may hand the loss something else: its recomputed π_old (verl's decoupled mode, TRL without
sampling log-probs), or a tensor it does not describe. Each plug-in maps its own user-facing spellings onto
:class:`MuSource` (verl's ``sat_mu``: ``rollout``, ``old_policy``; TRL's ``mu_source``: ``sampling``,
``old_policy``, ``auto`` resolved per batch) and logs the member's value, so one number means the same in both.
"""

from __future__ import annotations

from enum import Enum


class MuSource(Enum):
    """What the loss used as μ; the value is the logged flag (verl ``actor/sat_mu_is_rollout``, TRL
    ``sat/mu_source``)."""

    ENGINE = 1.0  # the rollout engine's sampling log-probs: the paper's μ
    OLD_POLICY = 0.0  # the trainer's recomputed π_old
    UNDECLARED = -1.0  # the framework did not say (verl without ``sat_mu``)
