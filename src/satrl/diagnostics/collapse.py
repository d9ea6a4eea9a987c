"""Collapse detection and the end-of-run summary (``summary.json``), applied the same way to every run.

Definition (also in docs/metrics.md, "Collapse"): let R(s) be the mean training reward over the last
``window`` steps ending at step s (defined once ``window`` rewards exist), and R*(s) = max_{s' <= s} R(s')
its running maximum. The run collapses at the first step s with

    R*(s) >= min_peak   and   R(s') < drop * R*(s)   for every s' >= s through the end of the run,

i.e. the rolling reward falls below ``drop`` times the best rolling reward seen so far and never again
reaches that level. A step with a non-finite loss is also a collapse; the collapse step is the earlier
of the two. A dip that later climbs back to ``drop * R*`` is not a collapse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CollapseConfig", "detect_collapse", "summarize_run"]


class CollapseConfig(BaseModel):
    """Parameters of the collapse definition (see module docstring / docs/metrics.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(10, ge=1, description="Steps in the trailing rolling mean of the training reward.")
    drop: float = Field(
        0.5, gt=0.0, lt=1.0, description="Collapse when the rolling reward stays below drop x its best value."
    )
    min_peak: float = Field(
        0.05, ge=0.0, description="Ignore runs whose best rolling reward is below this (never learned)."
    )


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


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _dedupe_by_step(rows: list[dict]) -> list[dict]:
    """Sort rows by ``step``; when a step repeats (a resumed run re-logged it) the last row wins.
    Rows without ``step`` get their 1-based position."""
    by_step: dict[int, dict] = {}
    for i, row in enumerate(rows, start=1):
        by_step[int(row.get("step", i))] = row
    return [by_step[s] | {"step": s} for s in sorted(by_step)]


def summarize_run(
    metrics_rows: list[dict], eval_rows: list[dict], collapse: CollapseConfig
) -> dict[str, Any]:
    """The statistics fields of ``summary.json`` (contracts.md), from a run's rows.

    Args:
        metrics_rows: the objects of ``metrics.jsonl`` (one per optimizer step; keys may be absent).
        eval_rows: the objects of ``eval.jsonl`` (``step``, ``avg_at_k``, ...).
        collapse: collapse-definition parameters.

    Returns a JSON-ready dict (Python floats/ints/None):
        ``best_avg_at_k``, ``best_step``: highest finite avg@k and its step (earliest on ties);
        ``final_avg_at_k``: avg@k of the last evaluation (by step);
        ``collapse_step``: :func:`detect_collapse` on ``train/reward`` (rows where it is absent or
            non-finite are skipped) and on the steps whose ``loss`` is present and non-finite;
        ``d_pi_last25``: mean ``obj/d_pi`` over the last ceil(25%) of steps (rows lacking it or NaN skipped);
        ``gate_rate_mean``: mean ``obj/gate_rate`` over the steps that have it, None if none do (non-SAT);
        ``steps``: the last optimizer step logged (0 for no rows).
        Every field is None when there is nothing to compute it from.
    """
    rows = _dedupe_by_step(metrics_rows)
    evals = sorted(
        (e for e in _dedupe_by_step(eval_rows) if _finite(e.get("avg_at_k"))), key=lambda e: e["step"]
    )

    best_avg = best_step = final_avg = None
    for e in evals:
        if best_avg is None or e["avg_at_k"] > best_avg:
            best_avg, best_step = float(e["avg_at_k"]), int(e["step"])
    if evals:
        final_avg = float(evals[-1]["avg_at_k"])

    reward_rows = [row for row in rows if _finite(row.get("train/reward"))]
    nonfinite = [row["step"] for row in rows if row.get("loss") is not None and not _finite(row.get("loss"))]
    collapse_step = detect_collapse(
        [float(row["train/reward"]) for row in reward_rows],
        nonfinite_steps=nonfinite,
        window=collapse.window,
        drop=collapse.drop,
        min_peak=collapse.min_peak,
        steps=[row["step"] for row in reward_rows],
    )

    tail = rows[len(rows) - math.ceil(len(rows) / 4) :] if rows else []
    d_pi = [float(row["obj/d_pi"]) for row in tail if _is_number(row.get("obj/d_pi"))]
    gate = [float(row["obj/gate_rate"]) for row in rows if _is_number(row.get("obj/gate_rate"))]
    return {
        "best_avg_at_k": best_avg,
        "best_step": best_step,
        "final_avg_at_k": final_avg,
        "collapse_step": collapse_step,
        "d_pi_last25": _mean(d_pi),
        "gate_rate_mean": _mean(gate),
        "steps": rows[-1]["step"] if rows else 0,
    }


def _is_number(v: Any) -> bool:
    """A present, non-NaN number (inf kept: a diverging d_pi must show in the summary)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
