"""How reports write numbers: percentage points, '—' for a missing number, intervals, table cells, and which
summary keys are a grid's endpoints. A leaf shared by the report, its verdicts and the demo."""

from __future__ import annotations

import math

import pandas as pd

from satrl.experiments.store import GridResults

__all__ = ["PCT", "endpoint_units", "endpoints", "fmt_ci"]

PCT = 100.0  # avg_at_k is a fraction in [0, 1]; the report shows percentage points, as the paper does


def _f(x: float, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    return "—" if x is None or not math.isfinite(float(x)) else fmt.format(float(x) * scale)


def _md_cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def fmt_ci(mean: float, lo: float, hi: float, fmt: str = "{:.1f}", scale: float = PCT) -> str:
    """'mean ± half-width [lo, hi]' (half-width = (hi - lo) / 2; the interval itself may be asymmetric)."""
    if not math.isfinite(mean):
        return "—"
    if not (math.isfinite(lo) and math.isfinite(hi)):  # one or two seeds: a mean without an interval, not "± 0"
        return f"{_f(mean, fmt, scale)} (no interval)"
    return f"{_f(mean, fmt, scale)} ± {_f((hi - lo) / 2, fmt, scale)} [{_f(lo, fmt, scale)}, {_f(hi, fmt, scale)}]"


def endpoint_units(endpoint: str) -> tuple[float, str, str]:
    """(scale, signed number format, unit) in which a report prints differences of ``endpoint``: points for a share
    (avg@k, pass@k, accuracy), the raw value to four places for d_pi."""
    return (1.0, "{:+.4f}", "") if endpoint.startswith("d_pi") else (PCT, "{:+.1f}", " points")


def endpoints(res: GridResults) -> dict[str, tuple[str, str]]:
    """Which summary keys the report uses, with their names: the primary endpoint (late-window test mean,
    no selection), the val-selected best on test, and the final test score. Runs made before the val/test
    split have only pooled scores: then the late-window mean of the pooled score, and the best pooled score
    (selected on the same problems it is reported on: optimistic, said in the name)."""
    have = lambda k: k in res.finished and pd.to_numeric(res.finished[k], errors="coerce").notna().any()  # noqa: E731
    if have("late_test_avg_at_k"):
        return {"primary": ("late_test_avg_at_k", "late test avg@k"),
                "best": ("best_test_avg_at_k", "test avg@k at the val-best step"),
                "final": ("final_test_avg_at_k", "final test avg@k")}  # fmt: skip
    return {"primary": ("late_avg_at_k", "late avg@k (all eval problems)"),
            "best": ("best_avg_at_k", "best avg@k (selected on itself: optimistic)"),
            "final": ("final_avg_at_k", "final avg@k")}  # fmt: skip
