"""Issue 60: the README's every number sits beside the command that prints it, and is in what that command prints.

A paragraph or bullet of the README that quotes a result (an interval, points, %, seconds, minutes, ×, runs, "N of
M") names in backticks the command(s) that print it, and each quote is in one of their outputs. A test cannot
retrain or re-time, and a report takes minutes to regenerate, so each command's output is the one committed for it:

- ``satrl report docs/results/X [FLAGS]``: docs/results/X/report.md, whose "Report:" line records that command with
  at least these flags (the sections the flags add are there);
- ``satrl leaderboard SPEC``: the committed leaderboard.md beside SPEC, which must hold the table the command's
  code computes now (``leaderboard_table``, run here);
- ``python -m benchmarks.M ...``: the section of docs/benchmarks.md whose "Command:" line is that command.

The README's line count and its other checks: tests/test_readme_front.py.
"""

import re
import shlex
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
NUM = r"[+\-−]?\d+(?:\.\d+)?"
QUOTE = re.compile(
    rf"(?<![\w@.\-/]){NUM} \[{NUM}, {NUM}\]|\[{NUM}, {NUM}\]"  # an estimate with its interval, or the interval
    rf"|(?<![\w@.\-/]){NUM} and {NUM} points"  # "0.62 and 3.94 points"
    rf"|(?<![\w@.\-/]){NUM}(?:-{NUM})? ?(?:points|%|×|s|min|minutes|runs)(?!\w)"  # a number with its unit
    r"|\b\d+ of \d+\b"  # seeds in the predicted direction
)
COMMAND = re.compile(r"`((?:satrl (?:report|leaderboard)|python -m benchmarks\.\w+)[^`]*)`")
# Quotes no command prints: each is derived by hand, in the document named, from numbers a command prints.
# What is left of issue 60 for them: a command (or a report column) that prints them. ("24" is in the SAT trial's
# report, in another row: a bare number's check cannot tell, so the list says it.)
DERIVED = {
    "3 minutes": "Makefile",  # `make test-fast`: no benchmark times it (benchmarks.ci_time times `make test`)
    "24 %": "docs/results/sat_trial/findings.md",  # 1 − 0.0233 / 0.0308, the report's d_pi of SAT-GRPO and GRPO
}


def _norm(text: str) -> str:
    return text.replace("−", "-")


def paragraphs(text: str) -> list[str]:
    """The README's prose as paragraphs and bullets, one line each; code blocks and the results table (checked
    against its generator in test_readme_front) left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for para in re.split(r"\n(?=- )|\n\n|\n(?=#)", text):
        if not para.lstrip().startswith("|"):
            out.append(re.sub(r"\s*\n\s*", " ", para))
    return out


def quotes(para: str) -> list[str]:
    """The results quoted in ``para`` (not in its commands, not in its links' targets)."""
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", para))
    return QUOTE.findall(prose)


@cache
def output(command: str) -> str:
    """What ``command`` prints, as committed (see the module's docstring); AssertionError if nothing committed is
    that command's output."""
    words = shlex.split(command)
    if words[:2] == ["satrl", "report"]:
        report = (REPO / words[2] / "report.md").read_text()
        recorded = re.search(r"^- Report: `([^`]+)`", report, re.M).group(1)
        rec = shlex.split(recorded)
        assert rec[:3] == words[:3], f"{words[2]}/report.md was made by {recorded}, not {command}"
        pairs = set(zip(rec[3:], rec[4:]))
        missing = [f for f in zip(words[3::2], words[4::2]) if f not in pairs]
        assert not missing, f"{words[2]}/report.md was made by {recorded}, without {missing} of {command}"
        return report
    if words[:2] == ["satrl", "leaderboard"]:
        from satrl.experiments.across import leaderboard_table

        spec = REPO / words[2]
        committed = (spec.parent / "leaderboard.md").read_text()
        assert leaderboard_table(spec) in committed, f"{spec.parent}/leaderboard.md is not `{command}`'s table now"
        return committed
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    sections = re.findall(r"<!-- BEGIN .*?<!-- END [^>]*-->", bench, re.S)
    found = [s for s in sections if f"Command: `{command}`" in s]
    assert found, f"no section of docs/benchmarks.md was written by `{command}`"
    return found[0]


def _numbers(pattern: str, text: str) -> set[float]:
    """The numbers (sign aside) of ``text`` that ``pattern`` (one group: the number) finds."""
    return {abs(float(t)) for t in re.findall(pattern, text)}


N = r"[+\-]?(\d+(?:\.\d+)?)"
CELL, PERCENT = rf"\|\s*{N}\s*(?=\|)", rf"(?<![\d.]){N} ?%"  # a table's cell; a percentage
IN_INTERVAL = rf"(?<![\d.]){N} \[|\[{N},|, {N}\]"  # an estimate, or an end of its interval


def printed(quote: str, out: str) -> bool:
    """Whether ``out`` prints ``quote``: an interval as written; "N of M" as N/M (or its complement); "N runs" as
    the report's run count; "N points" as an estimate or an interval's end (its sign aside: "costs 4.4 points" is a
    difference of −4.4); "N %" as a percentage; minutes as a table's seconds, rounded; seconds, ×, and a range of
    percentages as a table's cells."""
    q, out = _norm(quote), _norm(out)
    if "[" in q:
        return q in out
    if m := re.fullmatch(r"(\d+) of (\d+)", q):  # the reports count the seeds higher: "10 of 10 lower" is 0/10
        return f"{m[1]}/{m[2]}" in out or f"{int(m[2]) - int(m[1])}/{m[2]}" in out
    if m := re.fullmatch(r"(\d+) runs", q):
        return f"Runs: {m[1]} finished" in out
    if m := re.fullmatch(r"(\d+) (?:min|minutes)", q):
        return any(round(t / 60) == int(m[1]) for t in _numbers(CELL, out) if t >= 30)
    wanted = {abs(float(n)) for n in re.findall(NUM, q)}
    if q.endswith("points"):
        found = {float(x) for g in re.findall(IN_INTERVAL, out) for x in g if x}
    elif q.endswith("%") and len(wanted) == 1:
        found = _numbers(PERCENT, out)
    else:
        found = _numbers(CELL, out)
    return wanted <= found


def unprinted(text: str) -> dict[str, str]:
    """Each quote of ``text`` not printed by a command beside it -> why (no command, or which ones do not print it)."""
    problems = {}
    for para in paragraphs(text):
        found = quotes(para)
        if not found:
            continue
        commands = COMMANDS_OF(para)
        outs = [output(c) for c in commands]
        for quote in found:
            if not any(printed(quote, o) for o in outs):
                problems[quote] = f"not printed by {commands or 'any command beside it'}: {para[:70]}"
    return problems


def COMMANDS_OF(para: str) -> list[str]:  # noqa: N802  (a name read as a table: the commands of a paragraph)
    return COMMAND.findall(para)


def test_every_number_is_printed_by_the_command_beside_it():
    problems = unprinted(README.read_text())
    assert not set(problems) - set(DERIVED), {q: w for q, w in problems.items() if q not in DERIVED}


def test_each_derived_number_is_in_the_document_it_comes_from():
    """The quotes no command prints yet are still quoted, and are where the README says they come from."""
    text = " ".join(paragraphs(README.read_text()))
    for quote, source in DERIVED.items():
        assert quote in text, f"{quote!r} is no longer in the README: drop it from DERIVED"
        assert _norm(quote.split(" and ")[-1]).split()[0] in _norm((REPO / source).read_text()), (quote, source)


def test_every_command_beside_a_number_has_its_committed_output():
    commands = {c for para in paragraphs(README.read_text()) if quotes(para) for c in COMMANDS_OF(para)}
    assert {c.split()[1] for c in commands} >= {"report", "leaderboard", "-m"}
    for command in commands:
        assert output(command)


@pytest.mark.parametrize(
    "para, why",
    [
        ("- VCPO +4.3 [+3.0, +5.4] over GRPO (`satrl report docs/results/repair_trial`).", "not printed"),
        ("- VCPO +4.2 [+3.0, +5.4] over GRPO ([findings](docs/results/repair_trial/findings.md)).", "any command"),
        ("- lag 32 costs GRPO 4.9 points (`satrl report docs/results/damage_trial`).", "not printed"),
        ("- 91 runs (`satrl report docs/results/damage_trial`).", "not printed"),
        ("- the demo takes 56 s (`python -m benchmarks.demo_cost`).", "not printed"),
    ],
)
def test_the_check_fails_on_a_drifted_number_or_a_missing_command(para, why):
    problems = unprinted(para)
    assert len(problems) == 1 and why in next(iter(problems.values())), problems


def test_a_command_whose_committed_output_has_other_flags_is_refused():
    with pytest.raises(AssertionError, match="without"):
        output("satrl report docs/results/repair_trial --interaction vcpo,grpo,32,0")
    with pytest.raises(AssertionError, match="no section"):
        output("python -m benchmarks.demo_cost --repeats 9")
    assert unprinted("- VCPO +4.2 [+3.0, +5.4] over GRPO (`satrl report docs/results/repair_trial`).") == {}
