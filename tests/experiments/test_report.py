import argparse
import json
import textwrap

import pytest

from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.experiments.report import add_report_args, build_report, fmt_ci, run_report
from satrl.experiments.stats import bootstrap_ci
from satrl.experiments.store import pack_results

FIGS = ["eval_curves.png", "d_pi.png", "sat_diagnostics.png", "gate_check.png", "bylag.png", "paired.png"]


@pytest.fixture
def grid_out(tmp_path, fake_trainer):
    """A finished grid produced by the runner with the fake trainer: a (baseline), b (SAT, +0.1), bad (fails)."""
    command, _ = fake_trainer
    (tmp_path / "base.yaml").write_text("{}\n")
    (tmp_path / "g.yaml").write_text(
        textwrap.dedent("""
        name: toy
        description: A toy grid.
        base: base.yaml
        lags: [2]
        seeds: 3
        steps: 8
        baseline: a
        cells:
          a: {offset: 0.3, label: Alpha}
          b: {offset: 0.4, sat: true, label: Beta, collapse: true}
          bad: {fail: true}
    """)
    )
    out = tmp_path / "runs" / "toy"
    res = run_grid_spec(load_grid(tmp_path / "g.yaml"), out, workers=2, command_fn=command, progress=False)
    assert res.exit_code == 1
    return out


def _row(md: str, label: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(f"| {label} |"))


def test_report_table_matches_summaries(grid_out, tmp_path):
    dest = tmp_path / "report"
    path = build_report(grid_out, dest, n_resamples=2000)
    md = path.read_text()
    for f in FIGS:
        assert (dest / "figures" / f).stat().st_size > 5000, f
        assert f"](figures/{f})" in md
    for label, cell in (("Alpha", "a"), ("Beta", "b")):
        summaries = [
            json.loads((grid_out / cell / "lag2" / f"seed{s}" / "summary.json").read_text()) for s in range(3)
        ]
        best = bootstrap_ci([s["best_avg_at_k"] for s in summaries], n_resamples=2000)
        final = bootstrap_ci([s["final_avg_at_k"] for s in summaries], n_resamples=2000)
        row = _row(md, label)
        assert fmt_ci(*best) + " (8)" in row and fmt_ci(*final) in row
        collapses = sum(s["collapse_step"] is not None for s in summaries)
        assert f"| {collapses}/3" in row
    # by hand: best of b = 0.4 + 0.02 s - 0.02 -> mean 40.0 %; b's seed 1 collapses at step 6
    assert "40.0 ±" in _row(md, "Beta") and "1/3 (median step 6)" in _row(md, "Beta")
    # b's CI [38, 42] is clear of a's [28, 32]: bold, and the paired difference is exactly +10 points each seed
    assert "**40.0 ±" in _row(md, "Beta")
    assert "**Beta beats Alpha** by +10.0 points [+10.0, +10.0], wins 3/3 seeds." in md
    assert "`bad/lag2/seed0`: failed" in md
    assert "A toy grid." in md


def test_report_without_sat_or_baseline_skips_figures_and_states_overlap(tmp_path, make_run):
    out = tmp_path / "out"
    for s, (x, y) in enumerate([(0.30, 0.31), (0.34, 0.33), (0.32, 0.36)]):
        make_run(out, "grpo", 8, s, {"best_avg_at_k": x, "final_avg_at_k": x, "d_pi_last25": 0.01},
                 metrics=[{"step": 1, "obj/d_pi": 0.01}], evals=[{"step": 1, "avg_at_k": x, "k": 8}])  # fmt: skip
        make_run(out, "gspo", 8, s, {"best_avg_at_k": y, "final_avg_at_k": y, "d_pi_last25": 0.02},
                 metrics=[{"step": 1, "obj/d_pi": 0.02}], evals=[{"step": 1, "avg_at_k": y, "k": 8}])  # fmt: skip
    md = build_report(out, n_resamples=2000).read_text()
    assert "Lag 8, best avg@k: the top two, gspo and grpo, have overlapping CIs" in md
    rows = {line.split(" | ")[0]: line.split(" | ") for line in md.splitlines() if line.startswith("| g")}
    assert not any("**" in c for r in rows.values() for c in r[1:3])  # avg@k columns: overlap, no bold
    assert (
        rows["| grpo"][4].startswith("**0.0100") and "**" not in rows["| gspo"][4]
    )  # d_pi: separated, lower wins
    assert "Skipped: no SAT cells" in md and "Skipped: no `bylag/<k>/...` keys" in md
    assert (out / "figures" / "eval_curves.png").exists() and not (
        out / "figures" / "sat_diagnostics.png"
    ).exists()


def test_report_states_no_difference_when_ci_includes_zero(tmp_path, make_run):
    out = tmp_path / "out"
    (out).mkdir()
    (out / "grid.yaml").write_text("baseline: grpo\ncells: {grpo: {}, sat: {label: 'SAT |d|'}}\n")
    for s, d in enumerate([0.02, -0.03, 0.01, -0.01]):
        make_run(out, "grpo", 8, s, {"best_avg_at_k": 0.3, "final_avg_at_k": 0.3})
        make_run(out, "sat", 8, s, {"best_avg_at_k": 0.3 + d, "final_avg_at_k": 0.3})
    md = build_report(out, n_resamples=2000).read_text()
    assert "SAT |d| vs grpo at lag 8 (best avg@k): no detectable difference, the CI includes 0" in md
    assert "| SAT \\|d\\| | 29.8 ± " in md  # the pipe in the label does not break the table
    assert "wins 2/4 seeds" in md
    assert (
        "(final avg@k): no detectable difference, the CI includes 0: +0.0 points [+0.0, +0.0], wins 0/4 seeds (4 ties)"
        in md
    )


def test_report_cli_and_regeneration_from_packed_results(grid_out, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    packed = tmp_path / "packed"
    args = parser.parse_args(
        [str(grid_out), "--out", str(tmp_path / "r1"), "--resamples", "500", "--pack", str(packed)]
    )
    assert run_report(args) == 0 and "wrote" in capsys.readouterr().out
    r1 = (tmp_path / "r1" / "report.md").read_text()
    assert run_report(parser.parse_args([str(packed), "--resamples", "500"])) == 0
    r2 = (packed / "report.md").read_text()
    table = [line for line in r1.splitlines() if line.startswith("| Alpha") or line.startswith("| Beta")]
    assert table and table == [line for line in r2.splitlines() if line.startswith(("| Alpha", "| Beta"))]
    assert run_report(parser.parse_args([str(tmp_path / "nope")])) == 2
    assert pack_results(grid_out, tmp_path / "p2")  # non-empty


def test_report_named_pairs_section(tmp_path, make_run):
    """`pairs:` adds a method-vs-its-base table, with the known differences recovered and the chance count stated."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(
        "baseline: grpo\npairs: {sat: gspo}\ncells: {grpo: {}, gspo: {label: GSPO}, sat: {label: SAT-GSPO}}\n"
    )
    for s in range(5):
        make_run(out, "grpo", 8, s, {"best_avg_at_k": 0.5, "final_avg_at_k": 0.5, "d_pi_last25": 0.1})
        make_run(out, "gspo", 8, s, {"best_avg_at_k": 0.40 + s / 100, "final_avg_at_k": 0.4, "d_pi_last25": 0.2 + s / 100})
        make_run(out, "sat", 8, s, {"best_avg_at_k": 0.42 + s / 100, "final_avg_at_k": 0.4, "d_pi_last25": 0.19 + s / 100})
    md = build_report(out, n_resamples=2000).read_text()
    assert "## Named pairs: each method vs its base" in md
    row = next(line for line in md.splitlines() if line.startswith("| SAT-GSPO | GSPO | 8 |"))
    assert "+2.0 [+2.0, +2.0] (better)" in row and "| 5/5 |" in row and "+0.0 [+0.0, +0.0] (no difference)" in row
    assert row.endswith("| -0.0100 [-0.0100, -0.0100] (lower) | 5/5 |")
    assert "1 of the 2 avg@k intervals exclude 0. With 5 seeds" in md


def test_report_sat_activity_table(tmp_path, make_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text("cells: {grpo: {}, sat: {label: SAT}}\n")
    rows = [{"step": i + 1, "obj/q": q, "obj/sat_clipfrac": 0.01, "obj/gate_rate": 0.1, "gate/tv_share": 0.5}
            for i, q in enumerate([0.1, 0.3, 0.05, 0.4])]  # fmt: skip
    for s in range(2):
        make_run(out, "grpo", 8, s, {"best_avg_at_k": 0.3}, metrics=[{"step": 1, "obj/clipfrac": 0.1}])
        make_run(out, "sat", 8, s, {"best_avg_at_k": 0.3}, metrics=rows)
    md = build_report(out, n_resamples=500).read_text()
    assert "## How much SAT acted" in md
    assert "| SAT | 8 | 0.200 | 50% | 1.00% | 10.0% | 50.0% |" in md  # median of 0.05..0.4; 2 of 4 below log 1.2
    assert "| grpo | 8 |" not in md.split("## How much SAT acted")[1].split("##")[0]
