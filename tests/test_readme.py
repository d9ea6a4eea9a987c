"""The README's tensor example produces SAT's diagnostics, and docs/objectives.md's config is the resolved one
(every block of the docs runs or is checked in tests/test_doc_snippets.py)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_sat_example_runs():
    block = re.search(r"### The SAT loss on tensors\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gate_rate" in out.stdout and "q" in out.stdout


def test_objectives_doc_config_is_the_resolved_sat_grpo():
    """The YAML block of docs/objectives.md is what a sat_grpo run's config.yaml records."""
    import yaml

    from satrl.config import build_config, load_config

    doc = README.parent / "docs" / "objectives.md"
    (block,) = re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    shown = build_config(yaml.safe_load(block)).objective.model_dump()
    assert shown == load_config(README.parent / "configs" / "sat_grpo.yaml").objective.model_dump()
    assert yaml.safe_load(block)["objective"].keys() == shown.keys()


def test_the_citation_names_authors_and_the_papers_arxiv_identifier():
    """README's citation and CITATION.cff: an author for the software, the SAT paper's arXiv identifier and URL."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    cite = (root / "README.md").read_text().split("## Citation", 1)[1]
    assert "author = {" in cite and "arXiv:2607.18722" in cite and "https://arxiv.org/abs/2607.18722" in cite
    cff = yaml.safe_load((root / "CITATION.cff").read_text())
    assert cff["authors"] and cff["preferred-citation"]["url"] == "https://arxiv.org/abs/2607.18722"
    assert len(cff["preferred-citation"]["authors"]) == 9
