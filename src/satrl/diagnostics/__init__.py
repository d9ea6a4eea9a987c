"""Diagnostics: sampled training-inference mismatch, its decomposition, SAT gate vs TV mass, per-lag
breakdowns, MoE routing disagreement, collapse detection and the run summary.

Pure functions of tensors (or of logged rows): no logging, no config objects beyond ``CollapseConfig``.
How to read every metric: docs/metrics.md.
"""

from satrl.diagnostics.collapse import CollapseConfig, detect_collapse, eval_collapse
from satrl.diagnostics.lag import by_lag, lag_stats
from satrl.diagnostics.mismatch import decompose_mismatch, gate_tv_share, mismatch_stats
from satrl.diagnostics.routing import routing_disagreement
from satrl.diagnostics.step import step_diagnostics
from satrl.diagnostics.summary import realized_lag, summarize_run

__all__ = [
    "CollapseConfig",
    "by_lag",
    "decompose_mismatch",
    "detect_collapse",
    "eval_collapse",
    "gate_tv_share",
    "lag_stats",
    "mismatch_stats",
    "realized_lag",
    "routing_disagreement",
    "step_diagnostics",
    "summarize_run",
]
