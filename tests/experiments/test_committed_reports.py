"""Every committed report under docs/results/ regenerates from its packed runs unchanged, but for its own
provenance line (the command, commit and date it was written with), so a README command never dirties the
checkout."""

import re
import shutil
from pathlib import Path

import pytest

from satrl import cli
from test_readme_front import NUM, _norm, one_line

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
GRIDS = sorted(p.parent.name for p in RESULTS.glob("*/report.md"))
PROVENANCE = re.compile(r"^- Report: `satrl report .*$", re.M)


def _options(report: str) -> list[str]:
    """The report's own options (e.g. sensitivity seeds) from its provenance line."""
    cmd = re.search(r"^- Report: `satrl report ([^\s`]+)([^`]*)`", report, re.M)
    opts = cmd.group(2).split()
    return [o for i, o in enumerate(opts) if o != "--out" and (i == 0 or opts[i - 1] != "--out")]


# The one regeneration that also writes its figures (every figure of the report drawn, none skipped): the others
# compare report.md alone, so they skip the PNG writes, which are not compared (each figure's data and its section
# in report.md are still computed; this grid and tests/experiments/test_report.py cover the writing).
RENDERED = "repair_trial"


@pytest.mark.parametrize("grid", GRIDS)
def test_committed_report_regenerates_unchanged(tmp_path, grid, monkeypatch):
    committed = (RESULTS / grid / "report.md").read_text()
    if grid != RENDERED:
        from satrl.experiments import plots

        monkeypatch.setattr(plots, "_save", lambda fig, path, title=None: plots.plt.close(fig))
    copy = tmp_path / grid
    shutil.copytree(RESULTS / grid, copy, ignore=shutil.ignore_patterns("figures", "report.md"))
    # in this process (the command's own parsing and handler, not a new interpreter importing the stack again)
    assert cli.main(["report", str(copy), "--out", str(copy), *_options(committed)]) == 0
    fresh = (copy / "report.md").read_text()
    assert PROVENANCE.sub("", fresh) == PROVENANCE.sub("", committed)
    if grid == RENDERED:  # every figure the report links was written
        links = re.findall(r"^!\[[^]]*\]\(([^)]+)\)", fresh, re.M)
        assert links and all((copy / link).is_file() for link in links)


def test_the_check_sees_a_changed_number(tmp_path):
    """The comparison can fail: one digit changed in a committed report is a difference."""
    committed = (RESULTS / "sat_trial" / "report.md").read_text()
    changed = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), committed, count=40)
    assert PROVENANCE.sub("", changed) != PROVENANCE.sub("", committed)


# findings whose every quoted estimate-with-interval is one its report, or a report it links, prints (older findings
# quote other commands' numbers too, each named beside it)
ESTIMATE = re.compile(rf"{NUM} \[{NUM}, {NUM}\]")  # an estimate with its interval (the README check's NUM)
LINKED_REPORT = re.compile(r"\]\(\.\./(\w+)/report\.md\)")
FINDINGS_FROM_REPORT = ["baselines_trial", "countdown_damage", "damage_trial", "repair_trial", "sat_trial", "vcpo_factorial"]


def quoted_not_in_report(findings: str, report: str) -> list[str]:
    """The intervals ``findings`` quotes that ``report`` does not print (minus signs as one character; an interval
    wrapped over two lines is read as one). What a command in backticks prints, quoted in backticks beside it, is
    that command's output, not the report's."""
    printed = _norm(report)
    prose = re.sub(r"`[^`]*`", "", one_line(findings))
    return [q for q in ESTIMATE.findall(prose) if _norm(q) not in printed]


@pytest.mark.parametrize("grid", FINDINGS_FROM_REPORT)
def test_findings_quote_their_reports_numbers(grid):
    findings, report = ((RESULTS / grid / name).read_text() for name in ("findings.md", "report.md"))
    report += "".join((RESULTS / other / "report.md").read_text() for other in LINKED_REPORT.findall(findings))
    assert ESTIMATE.findall(findings), f"{grid}/findings.md quotes no interval"
    assert quoted_not_in_report(findings, report) == []


def test_the_findings_check_sees_a_drifted_number():
    report = (RESULTS / "repair_trial" / "report.md").read_text()
    assert quoted_not_in_report("VCPO +4.2 [+3.0, +5.4] over GRPO", report) == []
    assert quoted_not_in_report("VCPO +4.3 [+3.0, +5.4] over GRPO", report) == ["+4.3 [+3.0, +5.4]"]


def test_the_factorials_descriptive_numbers_are_its_runs():
    """vcpo_factorial/findings.md's numbers from its own command (OPOB and VCPO at lag 32 minus GRPO at lag 0, not in
    the report) and its cost are what the packed runs give."""
    import json

    from satrl.experiments.significance import sign_flip_interval

    here = RESULTS / "vcpo_factorial"
    text = _norm(one_line((here / "findings.md").read_text()))
    late = lambda c, lag: {p.parent.name: json.loads(p.read_text())["late_test_avg_at_k"]  # noqa: E731
                           for p in here.glob(f"{c}/lag{lag}/seed*/summary.json")}  # fmt: skip
    grpo0, quoted = late("grpo", 0), {}
    for cell in ("opob", "vcpo"):
        d = [100 * (v - grpo0[s]) for s, v in late(cell, 32).items()]
        lo, hi = sign_flip_interval(d)
        quoted[cell] = (f"{sum(d) / len(d):.1f}", f"{lo:.1f} to {hi:+.1f}", f"{sum(x > 0 for x in d)} of {len(d)}")
    (m, iv, n), (m2, iv2, n2) = quoted["opob"], quoted["vcpo"]
    assert f"{m} points (sign-flip interval {iv}, higher on {n} seeds)" in text
    assert f"GRPO at lag 0 {m2} ({iv2}, {n2})" in text
    hours = sum(json.loads(p.read_text())["wall_time_s"] for p in here.glob("*/lag*/seed*/summary.json")) / 3600
    assert f"{hours:.1f} machine-hours" in text


def test_the_factorials_run_times_and_validation_interaction_are_its_runs():
    """vcpo_factorial/findings.md's per-cell median run times (the cells with OPOB, without) and the interaction on
    the validation problems (not in the report) are what the packed runs give (issue 58: they were misquoted)."""
    import json
    import statistics

    from satrl.diagnostics.summary import late_mean
    from satrl.experiments.significance import sign_flip_interval

    here = RESULTS / "vcpo_factorial"
    text = _norm(one_line((here / "findings.md").read_text()))
    med: dict[str, list[float]] = {}
    for p in here.glob("*/lag*/seed*/summary.json"):
        med.setdefault(f"{p.parts[-4]}/{p.parts[-3]}", []).append(json.loads(p.read_text())["wall_time_s"])
    med = {k: round(statistics.median(v)) for k, v in med.items()}
    with_opob = [med[k] for k in ("opob/lag0", "opob/lag32", "opob_unweighted/lag32", "vcpo/lag32")]
    assert f"{min(with_opob)}-{max(with_opob)} s for the four cells with OPOB" in text
    assert f"{med['grpo/lag0']} s (GRPO at lag 0) and {med['grpo/lag32']} s (GRPO at lag 32)" in text

    def late(cell: str, lag: int) -> dict[str, float]:
        return {p.parent.name: 100 * late_mean([json.loads(x) for x in p.read_text().splitlines()], "val_avg_at_k", 600)
                for p in here.glob(f"{cell}/lag{lag}/seed*/eval.jsonl")}  # fmt: skip

    at = {(c, lag): late(c, lag) for c in ("grpo", "opob") for lag in (0, 32)}
    gain = {lag: {s: at["opob", lag][s] - at["grpo", lag][s] for s in at["grpo", lag]} for lag in (0, 32)}
    d = [gain[32][s] - gain[0][s] for s in gain[0]]
    lo, hi = sign_flip_interval(d)
    share = sum(d) / sum(gain[32].values())
    assert f"interaction {sum(d) / len(d):+.2f}, sign-flip interval {lo:.2f} to {hi:+.2f}" in text
    assert f"and {share * 100:.0f} % on the same runs' 80 validation problems" in text
