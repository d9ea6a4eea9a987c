"""Experiments: multi-seed grids of `satrl train` runs, their statistics, and the report.

- spec:   GridSpec / load_grid / expand (grid YAML -> runs)
- grid:   run_grid_spec (the process runner; its command line is satrl.apps.grid)
- store:  load_results (runs, per-step metrics, eval curves as DataFrames), pack_results
- stats:  bootstrap_ci, paired_diff, cell_stats, paired_table
- report: build_report (figures in plots.py; its command line is satrl.apps.report)

Names are imported lazily so that `satrl.experiments.grid` (which `satrl grid` drives) does not pull in
pandas and matplotlib: each module by an import statement in a function of its own, so the import graph sees it.
"""

from types import ModuleType

from satrl.lazy import names_from

# Bootstrap resamples of the reports' intervals and of the leaderboard's repaired fraction, by default: here, so that
# the command line's help states them without importing numpy and pandas.
N_RESAMPLES = 10_000


def _module(name: str) -> ModuleType:
    """The experiments module ``name``, imported when one of its names is first asked for."""
    match name:
        case "spec":
            from satrl.experiments import spec as module
        case "grid":
            from satrl.experiments import grid as module
        case "stats":
            from satrl.experiments import stats as module
        case "store":
            from satrl.experiments import store as module
        case _:
            from satrl.experiments import report as module
    return module


_WHERE = {"GridSpec": "spec", "Run": "spec", "expand": "spec", "load_grid": "spec", "run_grid_spec": "grid",
          "bootstrap_ci": "stats", "cell_stats": "stats", "paired_diff": "stats", "paired_table": "stats",
          "load_results": "store", "pack_results": "store", "build_report": "report"}  # fmt: skip
__all__ = sorted(_WHERE)


__getattr__ = names_from(__name__, _WHERE, _module)
