"""Collapse detection: the eval-score rule (the run's ``collapse_step``) and the training-reward rule
(``reward_collapse_step``), both pure functions of logged numbers. Definitions also in docs/metrics.md.

**Eval rule** (:func:`eval_collapse`, the paper's sense: its GRPO falls from 0.34 to 0.14 on eval). With
``base`` the score before training and ``peak(s)`` the best eval score up to eval step s, the run collapses
at the first eval step s whose score is below

    level(s) = base + (1 - frac) * (peak(s) - base)

and stays below that level for ``confirm`` consecutive evals (s included). A drop seen only in the last
fewer-than-``confirm`` evals is *unconfirmed* (:func:`eval_collapse_status` reports it); a run whose peak
never exceeds ``base`` never collapses; a score that climbs back to the level ends the drop (recovered).

**Reward rule** (:func:`detect_collapse`, kept for old runs and as a second opinion): let R(s) be the mean
training reward over the last ``window`` steps ending at step s and R*(s) its running maximum. The run
collapses at the first step s with R*(s) >= min_peak and R(s') < drop * R*(s) for every s' >= s through the
end of the run. It reads the training reward, which can stay high while the eval score falls, and its
"through the end" clause is cut short by the end of the run, so it is no longer the headline rule.

Either way a step with a non-finite loss is also a collapse; the collapse step is the earlier of the two.

**Skip rule** (:func:`skipped_collapse`, folded into ``collapse_step`` when the run ends, ``RunDir.finish``): the
trainer skips a step whose loss, gradient or step size is not finite (``skipped`` = 1 in ``metrics.jsonl``) and
leaves the weights as they were, so a run whose weights were wrecked (e.g. by one huge update) can log finite losses
while no later step changes anything. When more than ``max_skipped_frac`` of the run's steps were skipped, the run
collapses at the first skipped step s from which on more than that share of the steps s..end were skipped (the
start of the stretch that broke it); a run whose every step is skipped collapses at step 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CollapseConfig", "detect_collapse", "eval_collapse", "eval_collapse_status", "skipped_collapse"]


class CollapseConfig(BaseModel):
    """Parameters of both collapse rules (see module docstring / docs/metrics.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf/NaN mean nothing here

    eval_frac: float = Field(
        0.5, gt=0.0, le=1.0, description="Eval rule: collapse when this share of the val gain over base is lost."
    )
    eval_confirm: int = Field(
        2, ge=1, description="Eval rule: consecutive evals (the first included) that must stay below the level."
    )

    window: int = Field(10, ge=1, description="Reward rule: steps in the trailing rolling mean of the training reward.")
    drop: float = Field(
        0.5, gt=0.0, lt=1.0, description="Reward rule: collapse when the rolling reward stays below drop x its best value."
    )
    min_peak: float = Field(
        0.05, ge=0.0, description="Reward rule: ignore runs whose best rolling reward is below this (never learned)."
    )

    max_skipped_frac: float = Field(
        0.5, ge=0.0, le=1.0,
        description="Skip rule: the run collapses when more than this share of its optimizer steps were skipped "
        "(non-finite loss, gradient or step size; `skipped` = 1 in metrics.jsonl); 1 turns the rule off.",
    )  # fmt: skip


def _rolling_mean(x: Sequence[float], window: int) -> list[float]:
    """Trailing means of full windows: entry i is the mean of x[i : i + window] (ends at i + window - 1).
    Each window is summed afresh with ``math.fsum`` (exact, no running-sum drift; runs are short)."""
    return [math.fsum(x[i : i + window]) / window for i in range(len(x) - window + 1)]


def detect_collapse(
    rewards: Sequence[float],
    nonfinite_steps: Sequence[int] = (),
    window: int = 10,
    drop: float = 0.5,
    min_peak: float = 0.05,
    steps: Sequence[int] | None = None,
) -> int | None:
    """Step at which the run collapsed (definition in the module docstring), or None.

    Args:
        rewards: per-step mean training reward, in step order, all finite.
        nonfinite_steps: step numbers (same numbering as the return value) whose loss was non-finite.
        window, drop, min_peak: see :class:`CollapseConfig`.
        steps: the step number of each reward (e.g. from ``metrics.jsonl``); default 1-based indices.

    Returns: the step number of the collapse, or None.
    """
    CollapseConfig(window=window, drop=drop, min_peak=min_peak)  # validate, same messages as the config
    if steps is None:
        steps = list(range(1, len(rewards) + 1))
    if len(steps) != len(rewards):
        raise ValueError(
            f"steps has {len(steps)} entries but rewards has {len(rewards)}; give one step per reward"
        )
    bad = [(s, r) for s, r in zip(steps, rewards) if not math.isfinite(r)]
    if bad:
        raise ValueError(
            f"rewards must be finite; step {bad[0][0]} has {bad[0][1]} (drop missing steps instead)"
        )

    r = _rolling_mean(list(rewards), window)  # r[i] ends at step index i + window - 1
    candidates: list[int] = [min(nonfinite_steps)] if len(nonfinite_steps) else []
    if r:
        suffix_max = r[:]  # suffix_max[i] = max(r[i:])
        for i in range(len(r) - 2, -1, -1):
            suffix_max[i] = max(r[i], suffix_max[i + 1])
        peak = -math.inf
        for i, ri in enumerate(r):
            peak = max(peak, ri)
            if peak >= min_peak and suffix_max[i] < drop * peak:
                candidates.append(steps[i + window - 1])
                break
    return min(candidates) if candidates else None


def eval_collapse_status(
    steps: Sequence[int], scores: Sequence[float], base: float | None = None, frac: float = 0.5, confirm: int = 2
) -> tuple[int | None, int | None]:
    """``(collapse_step, unconfirmed_step)`` under the eval rule (module docstring).

    ``unconfirmed_step`` is the eval step where a drop below the level began that the run ended before
    ``confirm`` evals could confirm (None otherwise); it is only set when there is no confirmed collapse.
    Non-finite scores are an error (drop missing evals instead), as are mismatched lengths.
    """
    if len(steps) != len(scores):
        raise ValueError(f"steps has {len(steps)} entries but scores has {len(scores)}; give one step per score")
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac must lie in (0, 1], got {frac}")
    if confirm < 1:
        raise ValueError(f"confirm must be >= 1, got {confirm}")
    bad = [(s, x) for s, x in zip(steps, scores) if not math.isfinite(x)]
    if bad:
        raise ValueError(f"scores must be finite; eval step {bad[0][0]} has {bad[0][1]}")
    if not scores:
        return None, None
    base = float(scores[0]) if base is None else float(base)
    peak = -math.inf
    for i, x in enumerate(scores):
        peak = max(peak, x)
        if peak <= base:
            continue  # nothing learned yet: a score below base is not a collapse
        level = base + (1.0 - frac) * (peak - base)
        if x >= level:
            continue
        run = scores[i : i + confirm]
        if all(y < level for y in run):
            # Scores below the level cannot raise the peak, so the level is the same for the whole run.
            if len(run) == confirm:
                return int(steps[i]), None
            return None, int(steps[i])  # the run ended inside the confirmation window
    return None, None


def eval_collapse(
    steps: Sequence[int], scores: Sequence[float], base: float | None = None, frac: float = 0.5, confirm: int = 2
) -> int | None:
    """Eval step at which the run collapsed under the eval rule (module docstring), or None.

    Args:
        steps: the optimizer step of each evaluation, ascending.
        scores: the eval score (e.g. val avg@k) at each of those steps, all finite.
        base: the score before training (step 0); default the first score.
        frac: the share of the gain over ``base`` that must be lost (0.5: half of it).
        confirm: consecutive evals, the first included, that must stay below the level.

    Examples: ``0.30, 0.40, 0.50, 0.20, 0.18, 0.19`` collapses at the 4th eval's step; the same curve cut
    after ``0.50, 0.20`` does not (unconfirmed); ``0.30, 0.50, 0.20, 0.50, 0.50`` does not (recovered).
    """
    return eval_collapse_status(steps, scores, base, frac, confirm)[0]


def skipped_collapse(
    skipped: Sequence[bool], steps: Sequence[int] | None = None, max_frac: float = 0.5
) -> int | None:
    """Step at which the run collapsed under the skip rule (module docstring), or None.

    Args:
        skipped: per optimizer step, in step order, whether the trainer skipped it (``skipped`` = 1).
        steps: the step number of each entry; default 1-based indices.
        max_frac: the run collapses when more than this share of its steps were skipped (``max_skipped_frac``).

    Examples: every step skipped collapses at the first step; steps 2..4 of 4 skipped collapse at step 2; one
    skipped step in two is not more than half, so no collapse at the default 0.5.
    """
    CollapseConfig(max_skipped_frac=max_frac)  # validate, same messages as the config
    steps = list(range(1, len(skipped) + 1)) if steps is None else list(steps)
    if len(steps) != len(skipped):
        raise ValueError(f"steps has {len(steps)} entries but skipped has {len(skipped)}; one step per entry")
    flags = [bool(x) for x in skipped]
    if not flags or sum(flags) <= max_frac * len(flags):
        return None
    left = sum(flags)  # skipped steps from index i to the end
    for i, flag in enumerate(flags):
        if flag and left > max_frac * (len(flags) - i):
            return int(steps[i])
        left -= flag
    return None  # unreachable: the first skipped step already holds more than the whole run's share
