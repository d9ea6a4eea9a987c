"""Experiments: multi-seed grids of `satrl train` runs, their statistics, and the report.

- spec:   GridSpec / load_grid / expand (grid YAML -> runs)
- grid:   run_grid_spec (the process runner), CLI pair add_grid_args / run_grid
- store:  load_results (runs, per-step metrics, eval curves as DataFrames), pack_results
- stats:  bootstrap_ci, paired_diff, cell_stats, paired_table
- report: build_report, CLI pair add_report_args / run_report (figures in plots.py)

Names are imported lazily so that `satrl.experiments.grid` (used by the CLI) does not pull in
pandas and matplotlib.
"""

from importlib import import_module

_WHERE = {"GridSpec": "spec", "Run": "spec", "expand": "spec", "load_grid": "spec", "run_grid_spec": "grid",
          "bootstrap_ci": "stats", "cell_stats": "stats", "paired_diff": "stats", "paired_table": "stats",
          "load_results": "store", "pack_results": "store", "build_report": "report"}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"satrl.experiments.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'satrl.experiments' has no attribute {name!r}")
