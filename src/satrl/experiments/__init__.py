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


def _spec() -> ModuleType:
    from satrl.experiments import spec

    return spec


def _grid() -> ModuleType:
    from satrl.experiments import grid

    return grid


def _stats() -> ModuleType:
    from satrl.experiments import stats

    return stats


def _store() -> ModuleType:
    from satrl.experiments import store

    return store


def _report() -> ModuleType:
    from satrl.experiments import report

    return report


_WHERE = {"GridSpec": _spec, "Run": _spec, "expand": _spec, "load_grid": _spec, "run_grid_spec": _grid,
          "bootstrap_ci": _stats, "cell_stats": _stats, "paired_diff": _stats, "paired_table": _stats,
          "load_results": _store, "pack_results": _store, "build_report": _report}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(_WHERE[name](), name)
    raise AttributeError(f"module 'satrl.experiments' has no attribute {name!r}")
