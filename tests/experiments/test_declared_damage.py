"""A declared staleness-damage test: a hypothesis whose base is read at another lag (`base_lag`), so that a trial's
pre-registered damage test (a cell at lag 0 against itself at a larger lag) is reported as declared, not as the
exploratory lag-vs-lag table. Values by hand."""

import textwrap

from satrl.experiments.report import build_report, hypothesis_mixed_seeds
from satrl.experiments.stats import compare, lag_table
from satrl.experiments.store import load_runs

GRID = """
    baseline: grpo
    cells: {grpo: {label: GRPO}, opob: {label: OPOB}}
    hypotheses:
      D: {method: grpo, base: grpo, lag: 0, base_lag: 8, family: damage, description: "staleness damages GRPO"}
      O1: {method: opob, base: grpo, lag: 8, family: repair}
"""


def _grid(out, make_run):
    """Six seeds; GRPO loses 3 points at lag 8 on even seeds, 4 on odd ones; OPOB gains 1 point at lag 8."""
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    for s in range(6):
        lag8 = 0.6 - 0.01 * (3 + s % 2)
        make_run(out, "grpo", 0, s, {"late_test_avg_at_k": 0.6, "summary_version": 2})
        make_run(out, "grpo", 8, s, {"late_test_avg_at_k": lag8, "summary_version": 2})
        make_run(out, "opob", 8, s, {"late_test_avg_at_k": lag8 + 0.01, "summary_version": 2})
    return out


def test_a_declared_damage_test_is_reported_as_declared(tmp_path, make_run, no_pngs):
    out = _grid(tmp_path / "out", make_run)
    md = build_report(out, n_resamples=500).read_text()
    sec = md.split("## Declared hypotheses: damage")[1].split("## ")[0]
    # differences 3, 4, 3, 4, 3, 4 points: all positive, p = 2/64; a family of one, so Holm leaves it. The interval:
    # a shift outside [3, 4] leaves six differences of one sign (p 2/64, rejected); at 3 (or 4) three are 0 with free
    # signs, p = 2 * 8/64 = 0.25, kept
    assert "| D | GRPO at lag 0 > GRPO at lag 8 | `late_test_avg_at_k` | 6 | +3.5 [+3.0, +4.0] | 0.0312 | 0.0312 |" in sec
    assert "| supported |" in sec
    assert "**D**: GRPO at lag 0 vs GRPO at lag 8 (late_test_avg_at_k): **GRPO at lag 0 is better**, +3.5 points" in sec
    assert "  Per seed (GRPO at lag 0 - GRPO at lag 8): s0 +3.0, s1 +4.0, s2 +3.0, s3 +4.0, s4 +3.0, s5 +4.0." in sec
    # a hypothesis at one lag reads as before
    rep = md.split("## Declared hypotheses: repair")[1].split("## ")[0]
    assert "| O1 | OPOB > GRPO at lag 8 | `late_test_avg_at_k` | 6 | +1.0 [+1.0, +1.0] |" in rep
    assert "  Per seed (OPOB - GRPO): s0 +1.0," in rep
    # the same comparison, exploratory, in the lag-vs-lag table (its sign the other way: lag 8 minus lag 0)
    assert "| GRPO | 8 vs 0 | -3.5 [-4.0, -3.0] | 0/6 |" in md
    lag_section = md.split("## Exploratory: staleness damage")[1].split("\n## ")[0]
    assert "Declared before the runs, and tested above: D (GRPO at lag 0 > GRPO at lag 8)." in lag_section


def test_compare_reads_the_base_at_its_own_lag(tmp_path, make_run):
    runs = load_runs(_grid(tmp_path / "out", make_run))
    (row,) = compare(runs, [("grpo", "grpo", 0, 8)], "late_test_avg_at_k").itertuples()
    assert (row.lag, row.base_lag, row.n, round(row.mean, 6), row.wins) == (0, 8, 6, 0.035, 6)
    (same,) = compare(runs, [("opob", "grpo", 8)], "late_test_avg_at_k").itertuples()  # base_lag defaults to lag
    assert (same.lag, same.base_lag, round(same.mean, 6)) == (8, 8, 0.01)
    damage = lag_table(runs).set_index("cell")  # each cell at its larger lag against its smallest: one row, grpo's
    assert list(damage.index) == ["grpo"] and (damage.loc["grpo", "lag"], damage.loc["grpo", "base_lag"]) == (8, 0)
    assert round(damage.loc["grpo", "mean"], 6) == -0.035


def test_a_damage_test_pairs_its_own_two_lags_for_cpu_kinds(tmp_path, make_run):
    runs = load_runs(_grid(tmp_path / "out", make_run))
    runs["machine"] = "AMD"
    runs.loc[(runs["cell"] == "grpo") & (runs["lag"] == 8) & (runs["seed"] == 2), "machine"] = "Intel"
    hyps = {"D": {"method": "grpo", "base": "grpo", "lag": 0, "base_lag": 8},
            "S": {"method": "opob", "base": "grpo", "lag": 8}}  # fmt: skip
    assert hypothesis_mixed_seeds(runs, hyps) == {"D": [2], "S": [2]}
    runs.loc[(runs["cell"] == "opob") & (runs["seed"] == 2), "machine"] = "Intel"
    assert hypothesis_mixed_seeds(runs, hyps) == {"D": [2], "S": []}
