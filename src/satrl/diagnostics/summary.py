"""The end-of-run summary (``summary.json``): endpoints, collapse, mismatch and realized lag, from logged rows.

Applied the same way to every run (and once, by ``python -m benchmarks.migrate_results``, to runs written
before a key existed, so an old packed grid is reported with today's rules). Every key is explained in
docs/metrics.md.

Endpoints follow "select on validation, report on test": the eval problems are split by a fixed hash into
``val`` and ``test`` parts (satrl.tasks.evaluate.split_val_test); the best step is chosen on val and
reported on test, and the primary endpoint, ``late_test_avg_at_k``, needs no selection at all.
"""

from __future__ import annotations

import math
from typing import Any

from satrl.diagnostics.collapse import CollapseConfig, detect_collapse, eval_collapse_status

__all__ = ["SUMMARY_VERSION", "late_mean", "late_window_start", "realized_lag", "summarize_run"]

# 2: val/test endpoints, eval-rule collapse, lag_realized. Summaries without the key are version 1.
SUMMARY_VERSION = 2


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_number(v: Any) -> bool:
    """A present, non-NaN number (inf kept: a diverging d_pi must show in the summary)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _dedupe_by_step(rows: list[dict]) -> list[dict]:
    """Sort rows by ``step``; when a step repeats (a resumed run re-logged it) the last row wins.
    Rows without ``step`` get their 1-based position."""
    by_step: dict[int, dict] = {}
    for i, row in enumerate(rows, start=1):
        by_step[int(row.get("step", i))] = row
    return [by_step[s] | {"step": s} for s in sorted(by_step)]


def late_window_start(last_step: int) -> int:
    """First step of the late window: the last ceil(25 %) of ``last_step`` optimizer steps, i.e. steps
    ``last_step - ceil(last_step / 4) + 1 .. last_step`` (the same window as ``d_pi_last25``)."""
    return last_step - math.ceil(last_step / 4) + 1


# What eval.jsonl's score keys end with (avg_at_k, val_avg_at_k, test_pass_at_k, greedy_acc, ...).
SCORE_SUFFIXES = ("avg_at_k", "greedy_acc", "pass_at_k")


def score_problem(row: dict) -> str | None:
    """Why an ``eval.jsonl`` row's scores cannot be read, in a few words naming the key: one holding something
    other than a number or null (a string, a list, true); None if every score is one. Readers skipped such a
    value without a word or failed on it with a traceback (issue 60)."""
    for key, value in row.items():
        if key.endswith(SCORE_SUFFIXES) and value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{key} is {str(value)[:40]!r}, not a number"
    return None


def late_mean(evals: list[dict], key: str, last_step: int) -> float | None:
    """Mean of ``key`` over the evals (sorted by step) in the late window of a run whose last optimizer step is
    ``last_step`` (:func:`late_window_start`); the last finite value when no eval falls in the window; None when
    no eval has ``key``. The primary endpoint ``late_test_avg_at_k`` is this on ``test_avg_at_k``, and the
    report's secondary endpoints are this on ``test_pass_at_k`` and ``test_greedy_acc``."""
    scored = [e for e in evals if _finite(e.get(key))]
    start = late_window_start(last_step)
    late = [float(e[key]) for e in scored if e["step"] >= start]
    return _mean(late or ([float(scored[-1][key])] if scored else []))


def realized_lag(rows: list[dict], warmup_steps: int = 0) -> dict[str, float] | None:
    """``{mean, min, max}`` of the lag (trainer version - sample version) over the trained tokens of every
    step after ``warmup_steps`` (the first rollout batch, generated before any training: its lag is 0 under
    every schedule). Falls back to all steps when the run is shorter than its warm-up.

    ``mean`` weights each step's token-mean ``lag/mean`` by its token count ``train/tokens``; ``min``/``max``
    read ``lag/min`` and ``lag/max``. None when no step logged a lag.
    """
    rows = [r for r in rows if _finite(r.get("lag/mean"))]
    late = [r for r in rows if r["step"] > warmup_steps]
    rows = late or rows
    if not rows:
        return None
    lo, hi, num, den = math.inf, -math.inf, [], []
    for r in rows:
        lo, hi = min(lo, float(r["lag/min"])), max(hi, float(r["lag/max"]))
        w = float(r["train/tokens"])
        num.append(w * float(r["lag/mean"]))
        den.append(w)
    total = math.fsum(den)
    return {"mean": math.fsum(num) / total if total > 0 else None, "min": lo, "max": hi}


def _score_key(evals: list[dict], part: str) -> str | None:
    """``{part}_avg_at_k`` if the evals have it (runs with a val/test split), else the pooled ``avg_at_k``
    for ``part == "all"``; None when there is no such score."""
    key = "avg_at_k" if part == "all" else f"{part}_avg_at_k"
    return key if any(_finite(e.get(key)) for e in evals) else None


def _endpoints(evals: list[dict], last_step: int) -> dict[str, Any]:
    """Best (selected on val, or on the pooled score for runs without a split), final and late-window
    scores. ``best_avg_at_k`` keeps its old meaning: the pooled score's maximum, selected on itself."""
    out: dict[str, Any] = dict.fromkeys(
        ("best_avg_at_k", "best_step", "final_avg_at_k", "late_avg_at_k", "best_val_avg_at_k",
         "best_test_avg_at_k", "late_test_avg_at_k", "final_test_avg_at_k"))  # fmt: skip
    pooled = [e for e in evals if _finite(e.get("avg_at_k"))]
    for e in pooled:  # strict ">" keeps the earliest step on ties
        if out["best_avg_at_k"] is None or e["avg_at_k"] > out["best_avg_at_k"]:
            out["best_avg_at_k"], out["best_step"] = float(e["avg_at_k"]), int(e["step"])
    if pooled:
        out["final_avg_at_k"] = float(pooled[-1]["avg_at_k"])
    out["late_avg_at_k"] = late_mean(pooled, "avg_at_k", last_step)

    if _score_key(evals, "val") and _score_key(evals, "test"):
        split = [e for e in evals if _finite(e.get("val_avg_at_k")) and _finite(e.get("test_avg_at_k"))]
        best = None
        for e in split:
            if best is None or e["val_avg_at_k"] > best["val_avg_at_k"]:
                best = e
        if best is not None:
            out["best_step"] = int(best["step"])
            out["best_val_avg_at_k"] = float(best["val_avg_at_k"])
            out["best_test_avg_at_k"] = float(best["test_avg_at_k"])
            out["final_test_avg_at_k"] = float(split[-1]["test_avg_at_k"])
            out["late_test_avg_at_k"] = late_mean(split, "test_avg_at_k", last_step)
    return out


def _collapse(rows: list[dict], evals: list[dict], cfg: CollapseConfig) -> dict[str, Any]:
    """The eval rule on val (pooled score for runs without a split) and the training-reward rule."""
    nonfinite = [row["step"] for row in rows if row.get("loss") is not None and not _finite(row.get("loss"))]
    reward_rows = [row for row in rows if _finite(row.get("train/reward"))]
    reward_step = detect_collapse(
        [float(row["train/reward"]) for row in reward_rows], nonfinite_steps=nonfinite, window=cfg.window,
        drop=cfg.drop, min_peak=cfg.min_peak, steps=[row["step"] for row in reward_rows],
    )  # fmt: skip
    key = _score_key(evals, "val") or _score_key(evals, "all")
    scored = [e for e in evals if key and _finite(e.get(key))]
    base = next((float(e[key]) for e in scored if e["step"] == 0), None)
    step, unconfirmed = eval_collapse_status(
        [int(e["step"]) for e in scored], [float(e[key]) for e in scored], base, cfg.eval_frac, cfg.eval_confirm
    )
    candidates = [s for s in (step, min(nonfinite) if nonfinite else None) if s is not None]
    return {
        "collapse_step": min(candidates) if candidates else None,
        "collapse_unconfirmed_step": unconfirmed if not candidates else None,
        "collapse_score": key,
        "reward_collapse_step": reward_step,
        "eval_base": base if base is not None else (float(scored[0][key]) if scored else None),
    }


def summarize_run(
    metrics_rows: list[dict], eval_rows: list[dict], collapse: CollapseConfig, warmup_steps: int = 0
) -> dict[str, Any]:
    """The statistics fields of ``summary.json``, from a run's rows.

    Args:
        metrics_rows: the objects of ``metrics.jsonl`` (one per optimizer step; keys may be absent).
        eval_rows: the objects of ``eval.jsonl`` (``step``, ``avg_at_k``, and with a val/test split
            ``val_avg_at_k`` / ``test_avg_at_k``).
        collapse: both collapse rules' parameters.
        warmup_steps: optimizer steps of the first rollout batch, left out of ``lag_realized``.

    Returns a JSON-ready dict (Python floats/ints/None; every field None when there is nothing to compute
    it from): the endpoints of :func:`_endpoints`, the collapse fields of :func:`_collapse`,
    ``lag_realized`` (:func:`realized_lag`), ``d_pi_last25`` (mean ``mismatch/d_pi`` over the last ceil(25 %)
    of steps), ``gate_rate_mean`` (None for non-SAT runs), ``steps`` (last step logged, 0 for none) and
    ``summary_version``.
    """
    rows = _dedupe_by_step(metrics_rows)
    evals = _dedupe_by_step(eval_rows)
    last_step = rows[-1]["step"] if rows else (evals[-1]["step"] if evals else 0)
    tail = rows[len(rows) - math.ceil(len(rows) / 4) :] if rows else []
    d_pi = [float(row["mismatch/d_pi"]) for row in tail if _is_number(row.get("mismatch/d_pi"))]
    gate = [float(row["obj/gate_rate"]) for row in rows if _is_number(row.get("obj/gate_rate"))]
    return {
        **_endpoints(evals, last_step),
        **_collapse(rows, evals, collapse),
        "lag_realized": realized_lag(rows, warmup_steps),
        "d_pi_last25": _mean(d_pi),
        "gate_rate_mean": _mean(gate),
        "steps": rows[-1]["step"] if rows else 0,
        "summary_version": SUMMARY_VERSION,
    }
