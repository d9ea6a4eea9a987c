"""The interaction of a factorial over lags (a method's gain at one lag minus at another): hand-derived values,
the reading against a declared margin, the report's section and flag, and bad input."""

import math
import textwrap

import numpy as np
import pandas as pd
import pytest

from satrl.cli import main
from satrl.experiments.interaction import Interaction, interaction, parse_interaction, reading
from satrl.experiments.significance import sign_flip_interval

GRID = "cells: {grpo: {lags: [0, 32], label: GRPO}, opob: {lags: [0, 32], label: OPOB}}\n"


def _runs(gain32, gain0, seeds=range(10)) -> pd.DataFrame:
    rows = []
    for s, g32, g0 in zip(seeds, gain32, gain0):
        base0, base32 = 0.80 + 0.003 * s, 0.75 - 0.002 * s
        rows += [("grpo", 0, s, base0), ("grpo", 32, s, base32), ("opob", 0, s, base0 + g0), ("opob", 32, s, base32 + g32)]
    return pd.DataFrame(rows, columns=["cell", "lag", "seed", "late_test_avg_at_k"]).assign(status="finished")


def test_hand_derived_interaction():
    """Gains of 5, 3 (with staleness) and 1, 1 (without) on two seeds: I = 4 and 2, mean 3 points."""
    r = interaction(_runs([0.05, 0.03], [0.01, 0.01], seeds=[3, 7]), Interaction("opob", "grpo", 32, 0),
                    "late_test_avg_at_k")  # fmt: skip
    assert r["n"] == 2 and r["seeds"] == [3, 7] and r["positive"] == 2
    assert r["mean"] == pytest.approx(0.03) and r["gain_lag_mean"] == pytest.approx(0.04)
    assert r["gain_ref_mean"] == pytest.approx(0.01)
    assert list(r["per_seed"]["I"]) == pytest.approx([0.04, 0.02])
    assert r["p"] == pytest.approx(0.5)  # two positive values: 2 of the 4 sign patterns are as extreme


def test_interval_and_p_are_the_sign_flip_tests_on_the_per_seed_values():
    rng = np.random.default_rng(1)
    g32, g0 = 0.03 + 0.02 * rng.standard_normal(12), 0.01 + 0.02 * rng.standard_normal(12)
    r = interaction(_runs(g32, g0, range(12)), Interaction("opob", "grpo", 32, 0), "late_test_avg_at_k")
    lo, hi = sign_flip_interval(g32 - g0)
    assert (r["lo"], r["hi"]) == pytest.approx((lo, hi)) and r["mean"] == pytest.approx(np.mean(g32 - g0))


def test_seed_range_and_missing_runs_restrict_the_seeds():
    runs = _runs([0.05] * 10, [0.01] * 10)
    runs = runs[~((runs["cell"] == "opob") & (runs["lag"] == 0) & (runs["seed"] == 5))]  # seed 5 lacks one run
    r = interaction(runs, Interaction("opob", "grpo", 32, 0, seeds=(4, 8)), "late_test_avg_at_k")
    assert r["seeds"] == [4, 6, 7, 8]


@pytest.mark.parametrize(("lo", "hi", "words"), [(0.001, 0.05, "above 0"), (-0.015, 0.019, "within the margin"),
                                                  (-0.01, 0.03, "inconclusive"), (-0.05, -0.03, "inconclusive")])  # fmt: skip
def test_reading_against_the_margin(lo, hi, words):
    assert words in reading({"lo": lo, "hi": hi}, margin=0.02)
    assert "no reading" in reading({"lo": lo, "hi": hi}, margin=None)
    assert "no reading" in reading({"lo": -math.inf, "hi": math.inf}, margin=0.02)


def test_parse_round_trips_and_refuses_bad_values():
    spec = parse_interaction("opob,grpo,32,0,34-49,2")
    assert spec == Interaction("opob", "grpo", 32, 0, (34, 49), 0.02)
    assert parse_interaction(spec.flag()) == spec
    assert parse_interaction("a,b,8,0").seeds is None and parse_interaction("a,b,8,0,all").seeds is None
    for bad in ("opob,grpo,32", "opob,grpo,x,0", "opob,grpo,32,0,49-34", "opob,grpo,32,0,34-49,-1", "a,b,1,0,1-2,z"):
        with pytest.raises(ValueError, match="METHOD,BASE,LAG|margin|seeds"):
            parse_interaction(bad)


@pytest.fixture
def grid(tmp_path, make_run):
    out = tmp_path / "grid"
    out.mkdir()
    (out / "grid.yaml").write_text(textwrap.dedent(GRID))
    runs = _runs([0.05, 0.03, 0.04], [0.01, 0.01, 0.0], seeds=range(3))
    for cell, lag, seed, v, _ in runs.itertuples(index=False, name=None):
        make_run(out, cell, lag, seed, {"late_test_avg_at_k": v, "summary_version": 2})
    return out


def test_report_flag_adds_the_section_and_records_itself(grid, capsys):
    assert main(["report", str(grid), "--resamples", "50", "--interaction", "opob,grpo,32,0,0-2,2"]) == 0
    md = (grid / "report.md").read_text()
    sec = md.split("## Interaction: OPOB vs GRPO, lag 32 against lag 0 (seeds 0-2)")[1].split("\n## ")[0]
    assert "| interaction I | +3.33 [" in sec and "I > 0 on 3/3" in sec
    assert "| 2 | +4.00 | +0.00 | +4.00 |" in sec and "Reading (margin 2 points)" in sec
    assert "--interaction opob,grpo,32,0,0-2,2`" in md  # the provenance line regenerates it
    assert "![Interaction: OPOB − GRPO, lag 0 and lag 32](figures/interaction_opob_grpo_32_0_s0-2.png)" in sec
    assert (grid / "figures" / "interaction_opob_grpo_32_0_s0-2.png").stat().st_size > 1000


def test_two_seed_sets_of_one_pair_get_a_figure_each(grid):
    """A sensitivity analysis asks for the same interaction on fewer seeds: each section shows its own figure (the
    countdown trial's report showed the second set's figure under both)."""
    flags = ["--interaction", "opob,grpo,32,0,0-2", "--interaction", "opob,grpo,32,0,1-2"]
    assert main(["report", str(grid), "--resamples", "50", *flags]) == 0
    md = (grid / "report.md").read_text()
    for seeds in ("0-2", "1-2"):
        sec = md.split(f"## Interaction: OPOB vs GRPO, lag 32 against lag 0 (seeds {seeds})")[1].split("\n## ")[0]
        assert f"(figures/interaction_opob_grpo_32_0_s{seeds}.png)" in sec
        assert (grid / "figures" / f"interaction_opob_grpo_32_0_s{seeds}.png").stat().st_size > 1000


def test_report_flag_refuses_a_cell_or_lag_the_grid_did_not_run(grid, capsys):
    assert main(["report", str(grid), "--resamples", "50", "--interaction", "opob,grpo,8,0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no runs of 'opob' at lag 8" in err[0]


def test_report_flag_refuses_a_malformed_value(grid, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(grid), "--interaction", "opob,grpo,32"])
    assert exc.value.code == 2 and "expected METHOD,BASE,LAG" in capsys.readouterr().err.splitlines()[-1]


def test_a_declared_interaction_needs_no_flag(grid, capsys, no_pngs):
    """The grid file's `interactions:` give the same section as the flag, headed as declared; the same one asked for
    again with the flag is not repeated; a declared one whose runs are not in yet says so instead of failing."""
    meta = (grid / "grid.yaml").read_text()
    (grid / "grid.yaml").write_text(meta + "interactions:\n  - {method: opob, base: grpo, lag: 32, reference_lag: 0, "
                                    "seeds: [0, 2], margin: 0.02}\n")  # fmt: skip
    assert main(["report", str(grid), "--resamples", "50"]) == 0
    md = (grid / "report.md").read_text()
    sec = md.split("## Declared interaction: OPOB vs GRPO, lag 32 against lag 0 (seeds 0-2)")[1].split("\n## ")[0]
    assert "| interaction I | +3.33 [" in sec and "I > 0 on 3/3" in sec and "Reading (margin 2 points)" in sec
    assert "--interaction" not in md.split("\n## ")[0]  # nothing to regenerate it with: the grid file declares it
    assert main(["report", str(grid), "--resamples", "50", "--interaction", "opob,grpo,32,0,0-2,2"]) == 0
    md = (grid / "report.md").read_text()
    assert md.count("interaction: OPOB vs GRPO") + md.count("## Interaction: OPOB") == 1
    (grid / "grid.yaml").write_text(meta + "interactions:\n  - {method: opob, base: grpo, lag: 8, reference_lag: 0}\n")
    assert main(["report", str(grid), "--resamples", "50"]) == 0
    sec = (grid / "report.md").read_text().split("## Declared interaction: OPOB vs GRPO, lag 8 against lag 0")[1]
    assert sec.split("\n## ")[0].strip().startswith("(every seed)\n\nNo runs of OPOB at lag 8 yet.")


@pytest.mark.parametrize(("body", "match"), [
    ("{method: opob, base: opob, lag: 32, reference_lag: 0}", "interaction would be 0"),
    ("{method: opob, base: grpo, lag: 32, reference_lag: 32}", "interaction would be 0"),
    ("{method: opob, base: grpo, lag: 8, reference_lag: 0}", "interactions.0: cell 'opob' does not run lag 8"),
    ("{method: opob, base: grpo, lag: 32, reference_lag: 0, margin: -1}", "margin"),
])  # fmt: skip
def test_a_declared_interaction_is_checked_when_the_grid_loads(tmp_path, body, match):
    from satrl.experiments.grid import load_grid

    (tmp_path / "base.yaml").write_text("steps: 8\n")
    grid = tmp_path / "g.yaml"
    grid.write_text(f"base: base.yaml\nlags: [0, 32]\ncells: {{grpo: {{}}, opob: {{}}}}\ninteractions:\n  - {body}\n")
    with pytest.raises(ValueError, match=match):
        load_grid(grid)
