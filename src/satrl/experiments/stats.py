"""Statistics over seeds: bootstrap intervals, paired comparisons with exact tests, per-cell summaries.

Everything here is seeded and vectorized numpy; no scipy. Two intervals for a mean over seeds: the
studentized (bootstrap-t) one, the default, whose simulated coverage at 5 and 10 seeds is within a point
or two of nominal on normal data, and the percentile bootstrap of the earlier reports, which is too narrow
with few seeds (about 86 % at 5 for a nominal 95 %). Those describe one cell. A paired comparison's interval
is the exact sign-flip test's own (the shifts it does not reject) and its MDE the same test's power, so that
interval, p-value, MDE and verdict all come from one test, Holm-corrected over one family (significance.py).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# Re-exported: the public home of the paired tests is satrl.experiments.stats.
from satrl.experiments.significance import (  # noqa: F401
    holm,
    iut_mde,
    mde,
    sign_flip_interval,
    sign_flip_mde,
    sign_flip_p,
    sign_flip_power,
    t_quantile,
)

# Bound the size of one [resamples, n] index block so huge inputs do not exhaust memory.
_MAX_BLOCK = 4_000_000


def _clean(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def _checked(values, ci: float) -> np.ndarray:
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must lie in (0, 1), got {ci}")
    return _clean(values)


def _resampled(x: np.ndarray, n_resamples: int, seed: int, stat) -> np.ndarray:
    """``stat`` of each of ``n_resamples`` resamples of ``x`` with replacement, seeded; ``stat`` maps a
    [b, n] block of resamples to [b]. Blocks bound the memory of one index matrix."""
    rng = np.random.default_rng(seed)
    n = x.size
    block = max(1, _MAX_BLOCK // n)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, block):
        stop = min(n_resamples, start + block)
        out[start:stop] = stat(x[rng.integers(0, n, size=(stop - start, n))])
    return out


def bootstrap_ci(
    values, n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap CI of the mean: returns (mean, lo, hi).

    NaN/inf values are dropped. Empty input gives (nan, nan, nan); one value v gives (v, nan, nan): one seed
    has no interval (a report shows the mean alone, not "± 0"); a constant sample gives a zero-width interval.
    """
    x = _checked(values, ci)
    n = x.size
    if n == 0:
        return (float("nan"),) * 3
    mean = float(x.mean())
    if n == 1:
        return mean, float("nan"), float("nan")
    if np.all(x == x[0]):
        return mean, mean, mean
    means = _resampled(x, n_resamples, seed, lambda xb: xb.mean(axis=1))
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
            res = _resampled_nanmean(v[:, a : a + chunk], idx)  # [R, chunk]
            lo[a : a + chunk], hi[a : a + chunk] = _percentiles(res, [tail, 100.0 - tail])
    return mean, lo, hi


def _resampled_nanmean(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``np.nanmean(v[idx], axis=1)`` for values ``v`` [n, c] and resamples ``idx`` [R, n], with the same numbers,
    without the [R, n, c] block nanmean copies, masks and sums: over a middle axis numpy's sum adds the n rows one
    after another, which the loop below does (the NaNs as 0, divided by the count of values). A single column
    (c = 1) numpy sums pairwise along n: it goes through nanmean itself (tests/experiments/test_stats.py checks
    the two agree bit for bit)."""
    if v.shape[1] < 2:
        return np.nanmean(v[idx], axis=1)
    nan = np.isnan(v)
    v0 = np.where(nan, 0.0, v)
    tot = v0[idx[:, 0]]  # [R, c], a copy
    for j in range(1, idx.shape[1]):
        tot += v0[idx[:, j]]
    if not nan.any():
        return tot / idx.shape[1]
    return tot / (~nan)[idx].sum(axis=1, dtype=np.intp)


def _percentiles(res: np.ndarray, q: list[float]) -> np.ndarray:
    """``np.nanpercentile(res, q, axis=0)`` with the same numbers, faster: nanpercentile loops over the columns in
    Python, so the columns without a NaN (nearly all) go through the vectorized np.percentile, which computes each
    column's percentile by the same interpolation (tests/experiments/test_stats.py checks the two agree bit for bit)."""
    full = ~np.isnan(res).any(axis=0)
    out = np.empty((len(q), res.shape[1]))
    if full.any():
        out[:, full] = np.percentile(res[:, full], q, axis=0)
    if not full.all():
        out[:, ~full] = np.nanpercentile(res[:, ~full], q, axis=0)
    return out


def studentized_ci(
    values, n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and studentized (bootstrap-t) CI of the mean: returns (mean, lo, hi).

    Each resample b gives t_b = (mean_b - mean) / se_b with se_b = sd_b / sqrt(n); the interval is
    ``(mean - t_{(1+ci)/2} * se, mean - t_{(1-ci)/2} * se)`` with the t_b percentiles. Resamples of one
    repeated value (se_b = 0, up to rounding) have no t_b and are left out: that is n / n^n of them (0.16 % at
    n = 5, 11 % at n = 3, where the interval is therefore rough). Its simulated coverage is in
    docs/benchmarks.md (``python -m benchmarks.coverage``). NaN/inf values are dropped; empty input gives
    NaNs; a constant sample gives a zero-width interval. One value, and two different values, have no interval
    (mean, nan, nan): at n = 2 every resample with an SD is the sample itself or its mirror, so every t_b is 0
    and the "interval" would have zero width however far apart the two values are.
    """
    x = _checked(values, ci)
    n = x.size
    if n == 0:
        return (float("nan"),) * 3
    mean = float(x.mean())
    tiny = 1e-12 * max(1.0, float(np.abs(x).max()))  # an SD below this is rounding noise of a constant
    if n == 1:
        return mean, float("nan"), float("nan")
    se = float(x.std(ddof=1)) / np.sqrt(n)
    if se <= tiny:
        return mean, mean, mean

    def t_stat(xb: np.ndarray) -> np.ndarray:  # [b, n] -> [b]
        mb, sb = xb.mean(axis=1), xb.std(axis=1, ddof=1) / np.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(sb > tiny, (mb - mean) / sb, np.nan)

    t = _resampled(x, n_resamples, seed, t_stat)
    t = t[np.isfinite(t)]
    if t.size == 0 or np.ptp(t) <= 1e-12:  # no spread of t_b (n = 2): the bootstrap-t says nothing
        return mean, float("nan"), float("nan")
    tail = (1.0 - ci) / 2.0
    t_lo, t_hi = float(np.quantile(t, tail, method="lower")), float(np.quantile(t, 1.0 - tail, method="higher"))
    return mean, mean - t_hi * se, mean - t_lo * se


# The interval a report uses for a mean over seeds, by name. Studentized is the default: the percentile
# bootstrap covers about 86 % at 5 seeds for a nominal 95 % (docs/benchmarks.md, benchmarks/coverage.py).
INTERVALS = {"studentized": studentized_ci, "percentile": bootstrap_ci}
DEFAULT_INTERVAL = "studentized"


def mean_ci(values, interval: str = DEFAULT_INTERVAL, n_resamples: int = 10_000, ci: float = 0.95,
            seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """(mean, lo, hi) with the interval named ``interval`` (a key of :data:`INTERVALS`)."""
    if interval not in INTERVALS:
        raise ValueError(f"unknown interval {interval!r}; valid choices: {sorted(INTERVALS)}")
    return INTERVALS[interval](values, n_resamples=n_resamples, ci=ci, seed=seed)


NO_DIFFERENCE = "no detectable difference at this power"


def verdict_words(n: int, mean: float, p_adj: float, alpha: float = 0.05, higher_is_better: bool = True) -> str:
    """'better' / 'worse' when the (Holm-adjusted) p is below ``alpha``, in the direction of the mean
    difference (method - base) read with ``higher_is_better``; else 'no detectable difference at this
    power'; 'no data' without shared seeds. Never decided by a raw CI."""
    if n == 0 or not np.isfinite(p_adj):
        return "no data"
    if p_adj < alpha and mean != 0:
        return "better" if (mean > 0) == higher_is_better else "worse"
    return NO_DIFFERENCE


@dataclass(frozen=True)
class PairedDiff:
    """method - baseline over the seeds both have: mean difference and the sign-flip test's interval [lo, hi],
    wins (method > baseline), ties, the SD of the paired differences, the exact sign-flip p-value and the
    sign-flip test's MDE at this n (alpha 0.05, power 0.8, the SD as observed)."""

    mean: float
    lo: float
    hi: float
    wins: int
    ties: int
    n: int
    sd: float = float("nan")
    p: float = 1.0
    mde: float = float("inf")
    per_seed: dict[int, float] = field(default_factory=dict)  # seed -> method - baseline, the test's data

    def verdict(self, p_adj: float | None = None, alpha: float = 0.05, higher_is_better: bool = True) -> str:
        """:func:`verdict_words` on ``p_adj`` (the corrected p of this comparison's family; default the raw p)."""
        return verdict_words(self.n, self.mean, self.p if p_adj is None else p_adj, alpha, higher_is_better)


def paired_diff(
    method_values: Mapping[int, float] | pd.Series,
    baseline_values: Mapping[int, float] | pd.Series,
    ci: float = 0.95,
) -> PairedDiff:
    """Paired comparison by seed of d[s] = method[s] - baseline[s] over shared seeds: mean, the ``ci`` interval
    that inverts the exact sign-flip test (:func:`sign_flip_interval`), its p-value and MDE.

    Seeds missing (or NaN) on either side are left out. wins = #seeds with method > baseline. The interval is
    the test's, not a bootstrap's: a bootstrap-t interval can reach past every per-seed difference (seeds 3-9
    of sat_trial's H1: +5.7 with no difference above +4.0), the test's cannot, and it agrees with the p-value.
    """
    m = {int(k): float(v) for k, v in dict(method_values).items()}
    b = {int(k): float(v) for k, v in dict(baseline_values).items()}
    seeds = sorted(s for s in m.keys() & b.keys() if np.isfinite(m[s]) and np.isfinite(b[s]))
    d = np.array([m[s] - b[s] for s in seeds])
    mean = float(d.mean()) if d.size else float("nan")
    lo, hi = sign_flip_interval(d, ci)
    sd = float(d.std(ddof=1)) if d.size > 1 else float("nan")
    return PairedDiff(mean, lo, hi, wins=int((d > 0).sum()), ties=int((d == 0).sum()), n=len(seeds), sd=sd,
                      p=sign_flip_p(d), mde=sign_flip_mde(sd, d.size), per_seed=dict(zip(seeds, d.tolist())))  # fmt: skip


@functools.lru_cache(maxsize=64)
def interval_coverage(n: int, interval: str = DEFAULT_INTERVAL, ci: float = 0.95, sims: int = 1000,
                      n_resamples: int = 2000, seed: int = 0, dist: str = "normal") -> float:  # fmt: skip
    """Simulated coverage of :func:`mean_ci`'s ``interval`` for the mean of ``n`` i.i.d. values drawn
    from ``dist`` (``normal`` or the skewed ``lognormal``). Reports state it next to their intervals;
    ``python -m benchmarks.coverage`` tabulates it."""
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    draw, truth = {"normal": (rng.normal, 0.0), "lognormal": (rng.lognormal, float(np.exp(0.5)))}[dist]
    hits = 0
    for i in range(sims):
        _, lo, hi = mean_ci(draw(size=n), interval, n_resamples=n_resamples, ci=ci, seed=seed + i)
        hits += lo <= truth <= hi
    return hits / sims


def _median(values) -> float:
    x = _clean(values)
    return float(np.median(x)) if x.size else float("nan")


# Per-run columns that cell_stats summarizes with a mean and CI: (summary key, column prefix, support).
# The support is where the mean can lie (avg@k is a share, d_pi a mean of |log ratio|s).
_SHARE, _NONNEG = (0.0, 1.0), (0.0, float("inf"))
CELL_METRICS = [("late_test_avg_at_k", "late_test", _SHARE), ("best_test_avg_at_k", "best_test", _SHARE),
                ("final_test_avg_at_k", "final_test", _SHARE), ("late_avg_at_k", "late", _SHARE),
                ("best_avg_at_k", "best", _SHARE), ("final_avg_at_k", "final", _SHARE),
                ("d_pi_last25", "d_pi", _NONNEG)]  # fmt: skip


def within_support(mean: float, lo: float, hi: float, support: tuple[float, float]) -> tuple[float, float, float]:
    """(mean, lo, hi) with the interval intersected with ``support``, the range the true mean lies in.

    A studentized interval is not range-respecting: with 3-5 seeds and one outlying seed its far end can pass
    100 % or 0 (e.g. [73.5, 106.8] for an avg@8). Cutting off the part that cannot hold the mean leaves every
    interval that covered it still covering it, so coverage does not drop; the mean itself is never moved."""
    a, b = support
    if not (np.isfinite(lo) and np.isfinite(hi)):  # no interval (empty input): nothing to cut
        return mean, lo, hi
    return mean, float(np.clip(lo, a, b)), float(np.clip(hi, a, b))


def cell_stats(
    runs: pd.DataFrame, n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0,
    interval: str = DEFAULT_INTERVAL,
) -> pd.DataFrame:  # fmt: skip
    """Per (cell, lag) summary over finished runs, one row each, in order of first appearance.

    Columns: n; for each (key, prefix, support) of :data:`CELL_METRICS`, ``<prefix>_mean/_lo/_hi`` (the
    interval cut to the support, :func:`within_support`; NaN where the
    runs lack the key, e.g. test scores of runs made before the val/test split); best_step_median;
    collapses (eval rule: runs with a ``collapse_step``), collapse_step_median, unconfirmed (runs with only
    an unconfirmed drop), reward_collapses (training-reward rule); lag_mean (mean over seeds of the run's
    realized mean lag), lag_min, lag_max (over seeds); gate_rate_mean (NaN for non-SAT cells).
    """
    cols = [k for k, _, _ in CELL_METRICS] + ["best_step", "collapse_step", "collapse_unconfirmed_step",
            "reward_collapse_step", "gate_rate_mean", "lag_realized_mean", "lag_realized_min", "lag_realized_max"]  # fmt: skip
    runs = runs.copy()
    for c in cols:
        if c not in runs:
            runs[c] = np.nan
        runs[c] = pd.to_numeric(runs[c], errors="coerce")
    if "status" in runs:
        runs = runs[runs["status"] == "finished"]
    rows = []
    for (cell, lag), g in runs.groupby(["cell", "lag"], sort=False):
        row: dict = dict(cell=cell, lag=int(lag), n=len(g))
        for key, prefix, support in CELL_METRICS:
            row[f"{prefix}_mean"], row[f"{prefix}_lo"], row[f"{prefix}_hi"] = within_support(
                *mean_ci(g[key], interval, n_resamples, ci, seed), support
            )
        gate = _clean(g["gate_rate_mean"])
        row.update(
            best_step_median=_median(g["best_step"]),
            collapses=int(g["collapse_step"].notna().sum()), collapse_step_median=_median(g["collapse_step"]),
            unconfirmed=int(g["collapse_unconfirmed_step"].notna().sum()),
            reward_collapses=int(g["reward_collapse_step"].notna().sum()),
            lag_mean=float(g["lag_realized_mean"].mean()), lag_min=float(g["lag_realized_min"].min()),
            lag_max=float(g["lag_realized_max"].max()),
            gate_rate_mean=float(gate.mean()) if gate.size else float("nan"),
        )  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def family_mde(paired_sd: float, n: int, family_size: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The MDE of one test in a Holm family of ``family_size``: the sign-flip test's own MDE
    (:func:`~satrl.experiments.significance.sign_flip_mde`) at level alpha / family_size, Holm's strictest step. A p below that level is rejected by Holm whatever its
    rank, so a true difference this large is declared with at least ``power``; at the plain alpha the MDE
    would promise power that the correction takes away."""
    return sign_flip_mde(paired_sd, n, alpha / max(1, family_size), power)


COMPARISON_COLUMNS = ["cell", "base", "lag", "base_lag", "metric", "mean", "lo", "hi", "wins", "ties", "n", "sd", "p",
                      "p_holm", "mde", "verdict", "per_seed"]  # fmt: skip


def compare(
    runs: pd.DataFrame,
    comparisons: list[tuple[str, str, int] | tuple[str, str, int, int]],
    metric: str,
    n_resamples: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
    alpha: float = 0.05,
    higher_is_better: bool = True,
) -> pd.DataFrame:
    """Each (method cell, base cell, lag[, base_lag]) paired by seed on ``metric`` (the base at ``base_lag``,
    default ``lag``; a cell against itself at another lag is a staleness damage): mean difference, the sign-flip test's
    ``ci`` interval (:func:`paired_diff`; ``n_resamples`` and ``seed`` are cell_stats' and unused here: the
    paired interval is exact), wins, paired SD, exact sign-flip p, Holm-adjusted p over exactly these comparisons (one family), MDE at each row's
    seed count and the family's strictest Holm level (:func:`family_mde`), and the verdict from the Holm p. Comparisons without finished runs on both sides are left
    out. Columns: :data:`COMPARISON_COLUMNS`."""
    if "status" in runs:
        runs = runs[runs["status"] == "finished"]
    rows, diffs = [], []
    for method, base, lag, *other in comparisons:
        base_lag = other[0] if other else lag
        m = runs[(runs["cell"] == method) & (runs["lag"] == lag)]
        b = runs[(runs["cell"] == base) & (runs["lag"] == base_lag)]
        if m.empty or b.empty or metric not in runs:
            continue
        d = paired_diff(dict(zip(m["seed"], pd.to_numeric(m[metric], errors="coerce"))),
                        dict(zip(b["seed"], pd.to_numeric(b[metric], errors="coerce"))), ci)  # fmt: skip
        diffs.append(d)
        rows.append(dict(cell=method, base=base, lag=int(lag), base_lag=int(base_lag), metric=metric, mean=d.mean, lo=d.lo, hi=d.hi,
                         wins=d.wins, ties=d.ties, n=d.n, sd=d.sd, p=d.p, mde=d.mde, per_seed=d.per_seed))  # fmt: skip
    adjusted = holm([d.p if d.n else float("nan") for d in diffs])
    for row, d, p_adj in zip(rows, diffs, adjusted):
        row.update(p_holm=p_adj, verdict=d.verdict(p_adj, alpha, higher_is_better),
                   mde=family_mde(d.sd, d.n, len(diffs), alpha))  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def paired_table(runs: pd.DataFrame, baseline: str, metric: str = "best_avg_at_k", n_resamples: int = 10_000,
                 ci: float = 0.95, seed: int = 0, **kw) -> pd.DataFrame:  # fmt: skip
    """Every non-baseline cell vs ``baseline`` at each lag both have (one Holm family): :func:`compare`."""
    fin = runs[runs["status"] == "finished"] if "status" in runs else runs
    if baseline not in set(fin["cell"]):
        raise ValueError(f"baseline cell {baseline!r} has no finished runs; cells: {sorted(set(fin['cell']))}")
    todo = [(c, baseline, int(lag)) for (c, lag), _ in fin.groupby(["cell", "lag"], sort=False) if c != baseline]
    return compare(runs, todo, metric, n_resamples, ci, seed, **kw)


def pairs_table(runs: pd.DataFrame, pairs: Mapping[str, str], metric: str = "best_avg_at_k",
                n_resamples: int = 10_000, ci: float = 0.95, seed: int = 0, **kw) -> pd.DataFrame:  # fmt: skip
    """Each method cell vs its own base cell (``pairs``: method -> base) at every lag both have, one Holm
    family: :func:`compare`."""
    todo = []
    for method, base in pairs.items():
        lags = set(runs.loc[runs["cell"] == method, "lag"]) & set(runs.loc[runs["cell"] == base, "lag"])
        todo += [(method, base, int(lag)) for lag in sorted(lags)]
    return compare(runs, todo, metric, n_resamples, ci, seed, **kw)


def lag_table(runs: pd.DataFrame, metric: str = "late_test_avg_at_k", n_resamples: int = 10_000, ci: float = 0.95,
              seed: int = 0, **kw) -> pd.DataFrame:  # fmt: skip
    """The damage staleness does to each cell: the cell at each of its lags vs the same cell at its smallest
    lag, paired by seed (one Holm family). Rows carry ``lag`` = the larger lag and ``base_lag``."""
    fin = runs[runs["status"] == "finished"] if "status" in runs else runs
    todo, base_lag = [], {}
    for cell, g in fin.groupby("cell", sort=False):
        lags = sorted(set(int(x) for x in g["lag"]))
        base_lag[cell] = lags[0]
        todo += [(cell, lag) for lag in lags[1:]]
    return compare(fin, [(c, c, lag, base_lag[c]) for c, lag in todo], metric, n_resamples, ci, seed, **kw)


def iut_row(t: pd.DataFrame, lower: bool) -> pd.Series:
    """The row a declared hypothesis is judged by, from its comparisons ``t`` (one per base), as the sat_trial
    protocol ("Tests") defines it: with one base, that comparison; with several, the intersection-union test,
    whose p is the largest of the comparisons' (two-sided sign-flip) p-values, so the binding comparison is the
    one with the largest p, and which is not supported if any difference has the wrong sign (``wrong_sign``
    counts them; ``k`` is the number of comparisons, ``sds`` their paired SDs, for the IUT's MDE). An earlier
    version put a wrong-sign comparison first and reported its p, which is not the protocol's IUT p."""
    wrong = (t["mean"] > 0) if lower else (t["mean"] < 0)
    # among equal p-values a wrong-sign comparison binds, since it is what the hypothesis fails on
    order = t.assign(_wrong=wrong).sort_values(["p", "_wrong"], ascending=False, kind="stable")
    row = order.iloc[0].drop("_wrong").copy()
    row["wrong_sign"], row["k"], row["sds"] = int(wrong.sum()), len(t), list(t["sd"])
    return row


def seed_values(runs: pd.DataFrame, cell: str, lag: int, metric: str) -> dict[int, float]:
    """``{seed: value}`` of ``metric`` for ``cell``'s finished runs at ``lag`` (non-finite values left out): what every
    per-seed pairing (repaired fraction, interaction, the cross-testbed leaderboard) pairs by seed."""
    fin = runs[runs["status"] == "finished"] if "status" in runs else runs
    g = fin[(fin["cell"] == cell) & (fin["lag"] == lag)]
    return {int(s): float(v) for s, v in zip(g["seed"], pd.to_numeric(g[metric], errors="coerce")) if np.isfinite(v)}


def repaired_fraction(runs: pd.DataFrame, method: str, base: str, lag: int, reference_lag: int,
                      metric: str = "late_test_avg_at_k", n_resamples: int = 10_000, ci: float = 0.95,
                      seed: int = 0) -> dict:  # fmt: skip
    """How much of the base's staleness damage the method repairs, on the seeds all three runs share:

        R = mean_s(method@lag − base@lag) / mean_s(base@reference_lag − base@lag)

    (1: the damage is fully repaired; 0: none of it; < 0: made worse). A ratio has no exact sign-flip
    interval; the ``ci`` interval here is the percentile bootstrap over seeds (numerator and denominator
    resampled together), which is unreliable when the damage's own interval reaches 0 (the ratio is then
    unbounded): read it next to the damage's sign-flip interval. Returns n, fraction, lo, hi, repair (the
    numerator's mean), damage (the denominator's mean) and per_seed {seed: (repair, damage)}."""
    m, b, ref = (seed_values(runs, c, at, metric) for c, at in ((method, lag), (base, lag), (base, reference_lag)))
    seeds = sorted(m.keys() & b.keys() & ref.keys())
    num = np.array([m[s] - b[s] for s in seeds])
    den = np.array([ref[s] - b[s] for s in seeds])
    out = {"n": len(seeds), "per_seed": {s: (float(x), float(y)) for s, x, y in zip(seeds, num, den)}}
    if not seeds:
        return {**out, "fraction": float("nan"), "lo": float("nan"), "hi": float("nan"), "repair": float("nan"),
                "damage": float("nan")}  # fmt: skip
    idx = np.random.default_rng(seed).integers(0, len(seeds), size=(n_resamples, len(seeds)))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = num[idx].mean(axis=1) / den[idx].mean(axis=1)
        frac = float(num.mean() / den.mean()) if den.mean() != 0 else float("nan")
    lo, hi = (np.nan, np.nan)  # one seed, or every resample 0/0 (no damage and no repair): no interval
    if len(seeds) > 1 and not np.isnan(boot).all():
        lo, hi = np.nanpercentile(boot, [50 * (1 - ci), 100 - 50 * (1 - ci)])
    return {**out, "fraction": frac, "lo": float(lo), "hi": float(hi), "repair": float(num.mean()),
            "damage": float(den.mean())}  # fmt: skip
