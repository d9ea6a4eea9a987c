"""Statistics over seeds: percentile bootstrap CIs, paired comparisons, per-cell summaries.

Everything here is seeded and vectorized numpy; no scipy. The percentile bootstrap is the
issue's choice: resample the N per-seed values with replacement, take the mean of each resample,
and report the (1-ci)/2 and (1+ci)/2 percentiles of those means. With very few seeds (N <= 3) it
is known to be too narrow (it cannot see beyond the observed values); the report says so.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

# Bound the size of one [resamples, n] index block so huge inputs do not exhaust memory.
_MAX_BLOCK = 4_000_000


def _clean(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def bootstrap_ci(
    values, n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap CI of the mean: returns (mean, lo, hi).

    NaN/inf values are dropped. Empty input gives (nan, nan, nan); one value v gives (v, v, v);
    a constant sample gives a zero-width interval.
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must lie in (0, 1), got {ci}")
    x = _clean(values)
    n = x.size
    if n == 0:
        return (float("nan"),) * 3
    mean = float(x.mean())
    if n == 1 or np.all(x == x[0]):
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    block = max(1, _MAX_BLOCK // n)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, block):
        stop = min(n_resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = x[idx].mean(axis=1)
    tail = (1.0 - ci) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return mean, float(lo), float(hi)


def bootstrap_curve(
    values: np.ndarray, n_resamples: int = 2_000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step bootstrap band over seeds. values: [n_seeds, n_steps] with NaN for missing.

    Seeds are resampled jointly across steps (one index matrix shared by all steps), so the
    band is the percentile bootstrap of the mean at each step. Returns (mean, lo, hi), each [n_steps].
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError(f"values must be [n_seeds, n_steps], got shape {v.shape}")
    n = v.shape[0]
    # All-NaN columns (a step no seed logged) are expected: they give NaN, silently.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(v, axis=0)
        if n <= 1:
            return mean, mean.copy(), mean.copy()
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(n_resamples, n))  # [R, n]
        tail = (1.0 - ci) / 2.0 * 100.0
        lo, hi = np.empty_like(mean), np.empty_like(mean)
        chunk = max(1, _MAX_BLOCK // (n_resamples * n))
        for a in range(0, v.shape[1], chunk):
            res = np.nanmean(v[:, a : a + chunk][idx], axis=1)  # [R, n, chunk] -> [R, chunk]
            lo[a : a + chunk], hi[a : a + chunk] = np.nanpercentile(res, [tail, 100.0 - tail], axis=0)
    return mean, lo, hi


@dataclass(frozen=True)
class PairedDiff:
    """method - baseline over the seeds both have: mean difference, CI, wins (method > baseline)."""

    mean: float
    lo: float
    hi: float
    wins: int
    ties: int
    n: int

    @property
    def verdict(self) -> str:
        """'better' if the CI lies above 0, 'worse' if below, 'no difference' if it includes 0."""
        if self.n == 0 or not np.isfinite(self.lo):
            return "no data"
        if self.lo > 0:
            return "better"
        if self.hi < 0:
            return "worse"
        return "no difference"


def paired_diff(
    method_values: Mapping[int, float] | pd.Series,
    baseline_values: Mapping[int, float] | pd.Series,
    n_resamples: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
) -> PairedDiff:
    """Paired comparison by seed: bootstrap CI of mean(method[s] - baseline[s]) over shared seeds.

    Seeds missing (or NaN) on either side are left out. wins = #seeds with method > baseline.
    """
    m = {int(k): float(v) for k, v in dict(method_values).items()}
    b = {int(k): float(v) for k, v in dict(baseline_values).items()}
    seeds = sorted(s for s in m.keys() & b.keys() if np.isfinite(m[s]) and np.isfinite(b[s]))
    d = np.array([m[s] - b[s] for s in seeds])
    mean, lo, hi = bootstrap_ci(d, n_resamples=n_resamples, ci=ci, seed=seed)
    return PairedDiff(mean, lo, hi, wins=int((d > 0).sum()), ties=int((d == 0).sum()), n=len(seeds))


@functools.lru_cache(maxsize=64)
def percentile_coverage(n: int, ci: float = 0.95, sims: int = 1000, n_resamples: int = 2000, seed: int = 0) -> float:
    """Simulated coverage of :func:`bootstrap_ci`'s percentile interval for the mean of ``n`` normal values.

    With few seeds the percentile bootstrap is too narrow (about 0.85 at n = 5 for a nominal 0.95), so a
    report's "CI excludes 0" fires more often than 5% of the time under no effect; reports use this to say
    how often."""
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(sims):
        _, lo, hi = bootstrap_ci(rng.normal(size=n), n_resamples=n_resamples, ci=ci, seed=seed + i)
        hits += lo <= 0.0 <= hi
    return hits / sims


def _median(values) -> float:
    x = _clean(values)
    return float(np.median(x)) if x.size else float("nan")


def cell_stats(
    runs: pd.DataFrame, n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0
) -> pd.DataFrame:
    """Per (cell, lag) summary over finished runs, one row each, in order of first appearance.

    Columns: n, best_mean/best_lo/best_hi, best_step_median, final_mean/final_lo/final_hi,
    collapses (runs with a collapse_step), collapse_step_median, d_pi_mean/d_pi_lo/d_pi_hi,
    gate_rate_mean (NaN for non-SAT cells).
    """
    cols = ["best_avg_at_k", "best_step", "final_avg_at_k", "collapse_step", "d_pi_last25", "gate_rate_mean"]
    runs = runs.copy()
    for c in cols:
        if c not in runs:
            runs[c] = np.nan
    if "status" in runs:
        runs = runs[runs["status"] == "finished"]
    rows = []
    for (cell, lag), g in runs.groupby(["cell", "lag"], sort=False):
        best = bootstrap_ci(g["best_avg_at_k"], n_resamples, ci, seed)
        final = bootstrap_ci(g["final_avg_at_k"], n_resamples, ci, seed)
        dpi = bootstrap_ci(g["d_pi_last25"], n_resamples, ci, seed)
        collapse = pd.to_numeric(g["collapse_step"], errors="coerce")
        gate = _clean(pd.to_numeric(g["gate_rate_mean"], errors="coerce"))
        rows.append(
            dict(
                cell=cell, lag=int(lag), n=len(g),
                best_mean=best[0], best_lo=best[1], best_hi=best[2],
                best_step_median=_median(pd.to_numeric(g["best_step"], errors="coerce")),
                final_mean=final[0], final_lo=final[1], final_hi=final[2],
                collapses=int(collapse.notna().sum()), collapse_step_median=_median(collapse),
                d_pi_mean=dpi[0], d_pi_lo=dpi[1], d_pi_hi=dpi[2],
                gate_rate_mean=float(gate.mean()) if gate.size else float("nan"),
            )
        )  # fmt: skip
    return pd.DataFrame(rows)


def paired_table(
    runs: pd.DataFrame,
    baseline: str,
    metric: str = "best_avg_at_k",
    n_resamples: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Every non-baseline cell vs `baseline` at each lag both have, paired by seed on `metric`.

    Columns: cell, lag, metric, mean, lo, hi, wins, ties, n, verdict.
    """
    if "status" in runs:
        runs = runs[runs["status"] == "finished"]
    if baseline not in set(runs["cell"]):
        raise ValueError(
            f"baseline cell {baseline!r} has no finished runs; cells: {sorted(set(runs['cell']))}"
        )
    rows = []
    for (cell, lag), g in runs.groupby(["cell", "lag"], sort=False):
        if cell == baseline:
            continue
        base = runs[(runs["cell"] == baseline) & (runs["lag"] == lag)]
        if base.empty:
            continue
        pd_ = paired_diff(
            dict(zip(g["seed"], g[metric])), dict(zip(base["seed"], base[metric])), n_resamples, ci, seed
        )
        rows.append(dict(cell=cell, lag=int(lag), metric=metric, mean=pd_.mean, lo=pd_.lo, hi=pd_.hi,
                         wins=pd_.wins, ties=pd_.ties, n=pd_.n, verdict=pd_.verdict))  # fmt: skip
    return pd.DataFrame(
        rows, columns=["cell", "lag", "metric", "mean", "lo", "hi", "wins", "ties", "n", "verdict"]
    )


def pairs_table(
    runs: pd.DataFrame,
    pairs: Mapping[str, str],
    metric: str = "best_avg_at_k",
    n_resamples: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Each method cell vs its own base cell (``pairs``: method -> base) at every lag both have, paired by
    seed. Columns as :func:`paired_table`, plus ``base``."""
    if "status" in runs:
        runs = runs[runs["status"] == "finished"]
    rows = []
    for method, base in pairs.items():
        for lag in sorted(set(runs.loc[runs["cell"] == method, "lag"]) & set(runs.loc[runs["cell"] == base, "lag"])):
            m = runs[(runs["cell"] == method) & (runs["lag"] == lag)]
            b = runs[(runs["cell"] == base) & (runs["lag"] == lag)]
            d = paired_diff(dict(zip(m["seed"], m[metric])), dict(zip(b["seed"], b[metric])), n_resamples, ci, seed)
            rows.append(dict(cell=method, base=base, lag=int(lag), metric=metric, mean=d.mean, lo=d.lo, hi=d.hi,
                             wins=d.wins, ties=d.ties, n=d.n, verdict=d.verdict))  # fmt: skip
    cols = ["cell", "base", "lag", "metric", "mean", "lo", "hi", "wins", "ties", "n", "verdict"]
    return pd.DataFrame(rows, columns=cols)


def separated(
    top: tuple[float, float], runner_up: tuple[float, float], higher_is_better: bool = True
) -> bool:
    """True when the top cell's CI (lo, hi) lies strictly beyond the runner-up's (no overlap)."""
    if higher_is_better:
        return top[0] > runner_up[1]
    return top[1] < runner_up[0]
