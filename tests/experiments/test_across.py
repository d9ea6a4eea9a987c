"""One leaderboard across testbeds (`satrl leaderboard`, experiments/across.py): hand-derived numbers on fake
results, the refusals, and the committed docs/results/leaderboard.md regenerating unchanged."""

from pathlib import Path

import pytest

from satrl import cli
from satrl.experiments.across import leaderboard_table

REPO = Path(__file__).resolve().parents[2]

SPEC = """\
title: Fake
description: Two fake testbeds.
testbeds:
  - {key: a, name: Bed A, results: bed_a, trial: trial A, base: grpo, lag: 32, reference_lag: 0, seeds: [0, 5]}
  - {key: b, name: Bed B, results: bed_b, trial: trial B, base: ppo, lag: 8, reference_lag: 1, seeds: [10, 15]}
methods:
  - {cell: half, label: Half}
  - {cell: worse, label: Worse}
"""


@pytest.fixture
def spec(tmp_path, make_run) -> Path:
    """Bed A: GRPO loses 4 points from lag 0 to lag 32 on seeds 0-5; `half` is 2 points above it at lag 32 on
    every seed (half the damage), `worse` 1 point below (-1/4 of it). Bed B: PPO loses 6 points from lag 1 to lag
    8 on seeds 10-15 and `half` gains all 6 back, but its seed-15 run is unfinished (so 5 seeds: an unbounded 95 %
    sign-flip interval, p = 2/32) and its seed 16, outside the range, is far below; `worse` runs only at lag 1
    there (not tested at lag 8)."""
    a, b = tmp_path / "bed_a", tmp_path / "bed_b"
    for folder, cells in ((a, "{grpo: {label: GRPO}}"), (b, "{ppo: {label: PPO}}")):
        folder.mkdir()
        (folder / "grid.yaml").write_text(f"cells: {cells}\n")
    end = lambda v: {"late_test_avg_at_k": v, "summary_version": 2}  # noqa: E731
    for s in range(6):
        g0, g32 = 0.80 + 0.002 * s, 0.76 + 0.002 * s
        for cell, lag, v in (
            ("grpo", 0, g0),
            ("half", 32, g32 + 0.02),
            ("worse", 32, g32 - 0.01),
        ):
            make_run(a, cell, lag, s, end(v))
        # the base at lag 32: realized mean lags 16.0-16.5 (mean 16.25), lr 5e-5: S·η = 8.125e-4
        lagged = {**end(g32), "lag_realized": {"mean": 16.0 + 0.1 * s, "min": 1, "max": 32}}
        make_run(a, "grpo", 32, s, lagged, config="train:\n  lr: 5.0e-05\n")
    for s in range(10, 17):
        p1, p8 = 0.70 + 0.001 * s, 0.64 + 0.001 * s
        for cell, lag, v in (("ppo", 1, p1), ("ppo", 8, p8), ("worse", 1, p1)):
            make_run(b, cell, lag, s, end(v))
        make_run(b, "half", 8, s, None if s == 15 else end(p8 + 0.06 if s < 16 else p8 - 0.5))
    path = tmp_path / "lb.yaml"
    path.write_text(SPEC)
    return path


def test_the_table_holds_the_hand_derived_numbers(spec):
    assert leaderboard_table(spec, n_resamples=200).splitlines() == [
        "| method | Bed A: vs GRPO at lag 32 | Bed A: repaired | Bed B: vs PPO at lag 8 | Bed B: repaired |",
        "|---|---|---|---|---|",
        # S·η: Bed A's from its runs; Bed B's runs record no realized lag and no learning rate
        "| *staleness damage: the base at its reference lag − at lag* | +4.0 [+4.0, +4.0], 6/6; "
        "S·η 16.2 × 5e-05 = 8.1e-04 | — | +6.0 [+6.0, +6.0], 6/6; S·η unknown | — |",
        # 6 equal differences: the sign-flip interval is that point, p = 2/2^6; with 5 seeds it is unbounded
        "| Half | +2.0 [+2.0, +2.0], 6/6, p 0.0312 | +0.50 [+0.50, +0.50] | +6.0 [—, —], 5/5, p 0.0625 | "
        "+1.00 [+1.00, +1.00] |",
        "| Worse | -1.0 [-1.0, -1.0], 0/6, p 0.0312 | -0.25 [-0.25, -0.25] | not tested | not tested |",
    ]


def test_s_eta_needs_one_learning_rate_and_every_realized_lag(tmp_path, make_run):
    """S·η is S (the mean realized lag over the base's runs at lag) times their one learning rate; two learning
    rates, or a run without its realized lag, leave it unknown rather than averaged over."""
    from satrl.experiments.across import _s_eta, lag_and_lr
    from satrl.experiments.store import load_runs

    def run(folder: str, seed: int, lr: str, mean: float | None) -> None:
        summary = {"lag_realized": {"mean": mean}} if mean is not None else {}
        make_run(tmp_path / folder, "grpo", 128, seed, summary, config=f"train:\n  lr: {lr}\n")

    run("one", 0, "1.0e-04", 60.0), run("one", 1, "1.0e-04", 66.0)
    assert _s_eta(lag_and_lr(load_runs(tmp_path / "one"), "grpo", 128)) == "S·η 63.0 × 1e-04 = 6.3e-03"
    run("two", 0, "1.0e-04", 60.0), run("two", 1, "5.0e-05", 60.0)
    run("gap", 0, "1.0e-04", 60.0), run("gap", 1, "1.0e-04", None)
    for folder in ("two", "gap"):
        assert _s_eta(lag_and_lr(load_runs(tmp_path / folder), "grpo", 128)) == "S·η unknown"


def test_a_p_below_one_in_ten_thousand_is_not_printed_as_zero():
    """16 of 16 seeds on one side: the exact two-sided sign-flip p is 2/2^16 (the VCPO factorial's OPOB row)."""
    from satrl.experiments.across import _p

    assert (_p(2 / 2**16), _p(2 / 2**10), _p(0.6016)) == ("3.1e-05", "0.0020", "0.6016")


def test_the_command_writes_the_page_and_the_figure(spec, tmp_path, capsys):
    assert cli.main(["leaderboard", str(spec), "--resamples", "200"]) == 0
    md = tmp_path / "leaderboard.md"  # the default --out: the spec's folder
    assert capsys.readouterr().out == f"wrote {md}\n"
    text = md.read_text()
    assert text.startswith("# Fake\n\nTwo fake testbeds.\n\nHow to read:")
    assert leaderboard_table(spec, n_resamples=200) in text
    assert "![Fake](figures/leaderboard.png)" in text and "- **Bed B** (`b`): trial B. Runs: `bed_b`" in text
    assert "seeds 10-15; base PPO (`ppo`) at lag 8, damage from lag 1." in text
    assert text.endswith(f"Regenerate: `satrl leaderboard {spec} --resamples 200`\n")
    assert (tmp_path / "figures" / "leaderboard.png").stat().st_size > 1000


BAD = {
    "unknown field": (("seeds: [0, 5]}", "seedz: [0, 5]}"), "testbeds.0.seedz: Extra inputs are not permitted"),
    "missing folder": (("results: bed_b", "results: bed_c"), "testbeds.1.results: no such folder"),
    "method on no testbed": (("{cell: worse, label: Worse}", "{cell: worse, label: Worse}\n  - {cell: vcp, label: V}"),
                             "methods.2.cell: 'vcp' was run on no testbed"),
    "base without its reference lag": (("reference_lag: 1", "reference_lag: 2"),
                                       "testbeds.1.base: 'ppo' has no finished runs at lag 2 on seeds 10-15"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_bad_spec_is_one_line_naming_the_file_and_the_field(spec, tmp_path, capsys, case):
    (old, new), named = BAD[case]
    spec.write_text(SPEC.replace(old, new))
    assert cli.main(["leaderboard", str(spec), "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"satrl leaderboard: {spec}: ")
    assert named in err, err
    assert not (tmp_path / "out").exists()


def test_the_committed_leaderboard_regenerates_unchanged(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert cli.main(["leaderboard", "docs/results/leaderboard.yaml", "--out", str(tmp_path)]) == 0
    committed = (REPO / "docs" / "results" / "leaderboard.md").read_text()
    assert (tmp_path / "leaderboard.md").read_text() == committed
    assert "| VCPO | +4.2 [+3.0, +5.4], 10/10, " in committed  # repair_trial/findings.md, P1
