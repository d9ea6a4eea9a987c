"""Diagnostics: sampled training-inference mismatch, its decomposition, SAT gate vs TV mass, per-lag
breakdowns, MoE routing disagreement, collapse detection and the run summary.

Pure functions of tensors (or of logged rows): no logging, no config objects beyond ``CollapseConfig``. Names are
imported when first asked for (as in :mod:`satrl.engines`), so that the run config's sections import no torch.
How to read every metric: docs/metrics.md.
"""

from types import ModuleType

from satrl.lazy import names_from


def _module(name: str) -> ModuleType:
    """The diagnostics module ``name``, imported when one of its names is first asked for (import statements, so the
    import graph sees each): the config's ``collapse:`` section (:mod:`.collapse`) is read without torch."""
    match name:
        case "collapse":
            from satrl.diagnostics import collapse as module
        case "lag":
            from satrl.diagnostics import lag as module
        case "mismatch":
            from satrl.diagnostics import mismatch as module
        case "routing":
            from satrl.diagnostics import routing as module
        case "step":
            from satrl.diagnostics import step as module
        case _:
            from satrl.diagnostics import summary as module
    return module


_WHERE = {"CollapseConfig": "collapse", "detect_collapse": "collapse", "eval_collapse": "collapse",
          "by_lag": "lag", "lag_stats": "lag", "decompose_mismatch": "mismatch", "gate_tv_share": "mismatch",
          "mismatch_stats": "mismatch", "routing_disagreement": "routing", "step_diagnostics": "step",
          "trainer_step_diagnostics": "step",
          "realized_lag": "summary", "summarize_run": "summary"}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
