"""The README's front page: its sections in the field's order, short enough to read in five minutes, and every
result it quotes equal to the document it cites (issue 47). The LICENSE it names ships in the wheel."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SECTIONS = ["Features", "Installation", "Quickstart", "What to turn on with stale rollouts", "Supported components",
            "Documentation", "Results", "Citation", "License"]  # fmt: skip
NUM = r"(?<![\w@.])[+\-−]?\d+(?:\.\d+)?"
# an estimate with its interval, a bare interval, "N points", "N %": what a README result quotes
INTERVAL = re.compile(rf"{NUM} \[{NUM}, {NUM}\]|\[{NUM}, {NUM}\]|{NUM} points|\d+ %")
LINK = re.compile(r"\]\((docs/results/[^)#]+\.md)\)")


def _norm(text: str) -> str:
    """Minus signs as one character (the findings write −, the reports -)."""
    return text.replace("−", "-")


def one_line(text: str) -> str:
    """Text wrapped over several lines as one line, so an interval wrapped over two is read as one."""
    return re.sub(r"\s*\n\s*", " ", text)


def test_sections_in_order_and_short():
    text = README.read_text()
    assert text.startswith("# satrl\n\n**")  # the tagline first
    assert re.findall(r"^## (.+)$", text, re.M) == SECTIONS
    assert len(text.splitlines()) <= 150


def results_sections(text: str) -> str:
    """The README's sections that quote results: what to turn on, and the results summary."""
    parts = re.split(r"^## ", text, flags=re.M)
    return "\n\n".join(p for p in parts if p.startswith(("What to turn on", "Results")))


def quoted_results(text: str) -> list[tuple[str, list[str], list[str]]]:
    """Every result quoted in a paragraph or bullet, with the result documents that paragraph links."""
    out = []
    for para in re.split(r"\n(?=- )|\n\n", text):
        if para.startswith("|"):  # the cross-testbed table: equal to its generator (test_the_table_is_the_leaderboards)
            continue
        found = INTERVAL.findall(one_line(para))
        if found:
            out.append((para, found, LINK.findall(para)))
    return out


def test_every_quoted_interval_is_in_the_document_it_cites():
    quotes = quoted_results(results_sections(README.read_text()))
    assert len(quotes) >= 5  # the results and what-to-turn-on paragraphs
    for para, found, links in quotes:
        assert links, f"a README paragraph quotes {found} without citing a results document: {para[:80]}"
        sources = _norm("".join((REPO / link).read_text() for link in links))
        for quote in found:
            assert _norm(quote) in sources, f"README quotes {quote!r}, which {links} do not contain"


def test_the_check_fails_on_a_drifted_number(tmp_path):
    para = "- VCPO +4.3 [+3.0, +5.4] ([findings](docs/results/repair_trial/findings.md))"
    ((_, found, links),) = quoted_results(para)
    sources = _norm((REPO / links[0]).read_text())
    assert _norm(found[0]) not in sources


@pytest.mark.slow
def test_the_wheel_ships_the_license(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names[-10:]


def test_the_quoted_vcpo_cost_is_the_benchmarks():
    """The README's VCPO cost is the paired ratio docs/benchmarks.md's "VCPO cost" table gives for the trial's
    trainer (python -m benchmarks.vcpo_cost rewrites that table)."""
    quoted = re.search(r"A batch costs (\d+\.\d+)× GRPO's", README.read_text()).group(1)
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    section = bench[bench.index("<!-- BEGIN VCPO cost -->"):bench.index("<!-- END VCPO cost -->")]
    row = re.search(r"\| trial [^|]*\| vcpo \| [\d.]+ \| (\d+\.\d+) \|", section).group(1)
    assert quoted == row


def _bench_section(name: str) -> str:
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    return bench[bench.index(f"<!-- BEGIN {name} -->"):bench.index(f"<!-- END {name} -->")]


def test_the_quoted_demo_and_regime_costs_are_the_benchmarks():
    """The Quickstart's demo cost (CPU s, wall s, machine, date) and "What to turn on"'s minutes per run are what
    docs/benchmarks.md's "Demo" section measured (python -m benchmarks.demo_cost rewrites it)."""
    text, section = README.read_text().replace("\n", " "), _bench_section("Demo")
    cpu, wall, where, date = re.search(r"three 50-step runs \((\d+) s of CPU, (\d+) s wall on a 2-core ([\w ]+?), "
                                       r"(\d{4}-\d\d-\d\d)", text).groups()  # fmt: skip
    row = re.search(r"\| `satrl demo` [^|]*\| (\d+) \| (\d+) \|", section)
    assert (wall, cpu) == row.groups() and where in section and f"Date: {date}" in section
    vcpo, grpo = re.search(r"take about (\d+) min on one core \(GRPO (\d+) min", text).groups()
    for command, quoted in (("configs/regimes/repair_trial.yaml objective.name=vcpo", vcpo),
                            ("configs/regimes/repair_trial.yaml", grpo)):  # fmt: skip
        s = re.search(rf"\| `satrl train {re.escape(command)}` \(600 steps\) \| (\d+) \|", section)
        assert int(quoted) == round(int(s.group(1)) / 60), (command, quoted, s.group(1))


def test_the_table_is_the_leaderboards():
    """The README's results table is `satrl leaderboard docs/results/leaderboard.yaml`'s, line for line (issue 49),
    so a number changed in either fails here."""
    from satrl.experiments.across import leaderboard_table

    text = README.read_text()
    expected = leaderboard_table(REPO / "docs" / "results" / "leaderboard.yaml")
    start = text.index(expected.splitlines()[0])
    assert text[start : start + len(expected)] == expected
    changed = re.sub(r"\+4\.2 \[", "+4.3 [", expected)
    assert changed != expected and changed not in text  # the comparison can fail
