"""Issue 60: a protocol committed as a symlink is resolved before the git check. Its target is what governs the
runs, so an uncommitted edit of the target is refused (before the fix it passed, the link's clean status checked
and the old blob recorded), and a link out of the checkout is one line (before: a ValueError traceback)."""

import subprocess
from pathlib import Path

import pytest

from satrl.experiments.preregistration import PreregistrationError, protocol_record


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A checkout with ``docs/real.md`` and ``protocol.md -> docs/real.md``, both committed."""
    r = tmp_path / "repo"
    (r / "docs").mkdir(parents=True)
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "docs" / "real.md").write_text("# protocol\n")
    (r / "protocol.md").symlink_to("docs/real.md")
    _git(r, "add", "docs/real.md", "protocol.md")
    _git(r, "commit", "-q", "-m", "protocol")
    return r


def test_a_linked_protocol_records_its_target(repo):
    rec = protocol_record(repo / "protocol.md")
    assert rec["path"] == "docs/real.md" and rec["blob"] == _git(repo, "rev-parse", "HEAD:docs/real.md")


def test_an_edited_target_of_a_committed_link_is_refused(repo):
    (repo / "docs" / "real.md").write_text("# protocol, edited after its commit\n")
    with pytest.raises(PreregistrationError, match="docs/real.md has uncommitted changes"):
        protocol_record(repo / "protocol.md")


def test_a_link_out_of_the_checkout_is_one_line(repo, tmp_path):
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# not committed anywhere\n")
    (repo / "out.md").symlink_to(outside)
    with pytest.raises(PreregistrationError) as err:
        protocol_record(repo / "out.md")
    assert "\n" not in str(err.value) and "not in a git checkout" in str(err.value)
