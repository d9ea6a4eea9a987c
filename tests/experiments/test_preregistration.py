"""Pre-registration the tool enforces (issue 48, item 3): a grid naming a protocol starts no run unless the protocol
is committed and unchanged, records the protocol's commit and blob in grid_status.json, runs on one code commit
unless told otherwise, and the report flags runs that started before the protocol's commit."""

import json
import subprocess
from pathlib import Path

import pytest

from satrl.apps import grid as grid_app
from satrl.experiments import grid as grid_mod
from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.experiments.preregistration import (
    PreregistrationError,
    check_commit,
    first_commit,
    protocol_record,
    runs_before,
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git checkout holding a one-run grid that names ``protocol.md`` (not committed yet)."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "base.yaml").write_text("steps: 8\n")
    (r / "g.yaml").write_text("base: base.yaml\nlags: [1]\nseeds: 1\nprotocol: protocol.md\ncells: {a: {sleep: 0}}\n")
    (r / "protocol.md").write_text("# protocol\n")
    _git(r, "add", "base.yaml", "g.yaml")
    _git(r, "commit", "-q", "-m", "grid")
    return r


@pytest.fixture
def clean_code(monkeypatch):
    """The satrl checkout's own commit, as a pinned worktree's would be (this test's checkout may be dirty)."""
    monkeypatch.setattr(grid_mod, "git_commit", lambda: "a" * 40)


def _run(repo: Path, out: Path, fake_trainer, **kw):
    command, _ = fake_trainer
    return run_grid_spec(load_grid(repo / "g.yaml"), out, command_fn=command, progress=False, **kw)


def test_an_uncommitted_or_edited_protocol_starts_no_run(repo, tmp_path, fake_trainer, clean_code):
    out = tmp_path / "out"
    with pytest.raises(PreregistrationError, match="protocol protocol.md is not committed"):
        _run(repo, out, fake_trainer)
    assert not (out / "a").exists()
    _git(repo, "add", "protocol.md")
    with pytest.raises(PreregistrationError, match="is not committed"):  # staged is not committed
        _run(repo, out, fake_trainer)
    _git(repo, "commit", "-q", "-m", "protocol, alone")
    (repo / "protocol.md").write_text("# protocol, edited after its commit\n")
    with pytest.raises(PreregistrationError, match="has uncommitted changes"):
        _run(repo, out, fake_trainer)
    assert not (out / "a").exists()


def test_a_committed_protocol_is_recorded_and_the_cli_says_why_in_one_line(repo, tmp_path, fake_trainer, clean_code,
                                                                           capsys):  # fmt: skip
    import argparse

    parser = argparse.ArgumentParser()
    grid_app.add_grid_args(parser)
    rc = grid_app.run_grid(parser.parse_args([str(repo / "g.yaml"), "--out", str(tmp_path / "cli")]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is not committed" in err[0]
    _git(repo, "add", "protocol.md")
    _git(repo, "commit", "-q", "-m", "protocol, alone")
    res = _run(repo, tmp_path / "out", fake_trainer)
    assert res.exit_code == 0
    rec = json.loads((tmp_path / "out" / "grid_status.json").read_text())["protocol"]
    assert rec["path"] == "protocol.md" and rec["commit"] == _git(repo, "log", "-1", "--format=%H")
    assert rec["blob"] == _git(repo, "rev-parse", "HEAD:protocol.md")


def test_a_grid_runs_on_one_commit_unless_told():
    history = [{"git_commit": "a" * 40, "finished": ["a/lag1/seed0"]}, {"git_commit": "b" * 40, "finished": []}]
    check_commit(history, "a" * 40, allow=False)  # the commit of the runs: fine
    check_commit([], "c" * 40, allow=False)  # no run finished yet: any committed checkout
    with pytest.raises(PreregistrationError, match="runs were made at aaaaaaaaaaaa, this checkout is cccccccccccc"):
        check_commit(history, "c" * 40, allow=False)
    with pytest.raises(PreregistrationError, match="committed checkout"):
        check_commit([], "a" * 40 + "+dirty", allow=False)
    check_commit(history, "c" * 40 + "+dirty", allow=True)


def test_runs_that_started_before_the_protocols_commit_are_flagged(tmp_path):
    dirs = {}
    for name, started in (("early", "2026-12-05T09:59:59"), ("late", "2026-12-05T10:00:01"), ("unknown", None)):
        d = dirs[name] = tmp_path / name
        d.mkdir()
        if started:
            (d / "environment.json").write_text(json.dumps({"sessions": [{"started": started}]}))
    local = __import__("datetime").datetime(2026, 12, 5, 10, 0, 0).astimezone().isoformat()
    assert runs_before(dirs, local) == ["early"]


def test_a_protocol_with_appended_sections_dates_its_runs_by_its_first_commit(repo, tmp_path):
    """Dated sections appended after runs began do not make those runs 'before the protocol': the record keeps the
    first commit (``added``), and the report flags only runs older than it (the countdown trial's report flagged 9
    runs that started after the protocol's first commit, before a dated section)."""
    import pandas as pd

    from satrl.experiments.report import _protocol_note
    from satrl.experiments.store import GridResults

    _git(repo, "add", "protocol.md")
    _git(repo, "commit", "-q", "-m", "protocol, alone")
    added = _git(repo, "rev-parse", "HEAD")
    (repo / "protocol.md").write_text("# protocol\n\n## Deviation, dated\n")
    _git(repo, "commit", "-q", "-am", "a dated deviation")
    rec = protocol_record(repo / "protocol.md")
    assert rec["commit"] != added and rec["added"] == added
    assert first_commit({**rec, "commit": "f" * 40}, repo) is None  # a commit the checkout lacks: git cannot tell
    assert first_commit(rec, tmp_path) is None  # not a checkout
    dirs = {}
    local = lambda iso: __import__("datetime").datetime.fromisoformat(iso).astimezone().replace(tzinfo=None)  # noqa: E731
    for name, delta in (("early", -60), ("between", 1)):  # before the first commit; after it, before the deviation
        d = dirs[name] = tmp_path / name
        d.mkdir()
        t = local(rec["added_at"]) + __import__("datetime").timedelta(seconds=delta)
        (d / "environment.json").write_text(json.dumps({"sessions": [{"started": t.isoformat()}]}))
    runs = pd.DataFrame({"run": list(dirs), "path": [str(p) for p in dirs.values()]})
    res = GridResults(tmp_path, runs, pd.DataFrame(), pd.DataFrame(), {"protocol_record": rec})
    (line,) = _protocol_note(res)
    assert f"first committed at `{added}`" in line and f"last changed (dated sections appended) at `{rec['commit']}`" in line
    assert line.endswith("**1 run(s) started before the protocol's first commit** (not governed by it): early.")
    # a record from before `added`, whose last change came an hour after the first commit (this test's two commits
    # share a second): dated by that change, as reports were, both runs are flagged
    later = (local(rec["added_at"]) + __import__("datetime").timedelta(hours=1)).astimezone().isoformat()
    legacy = {**{k: v for k, v in rec.items() if k not in ("added", "added_at")}, "committed_at": later}
    (line,) = _protocol_note(GridResults(tmp_path, runs, pd.DataFrame(), pd.DataFrame(), {"protocol_record": legacy}))
    assert f"at commit `{rec['commit']}`" in line and "2 run(s) started before the protocol's commit" in line


def test_the_vcpo_factorials_protocol_is_committed_and_unchanged():
    """The committed trial names its protocol, and the protocol is as committed (a test run in a clean clone)."""
    from satrl.experiments.preregistration import protocol_record

    spec = load_grid(Path(__file__).resolve().parents[2] / "configs" / "grids" / "vcpo_factorial.yaml", False)
    rec = protocol_record(spec.protocol_path())
    assert rec["path"] == "docs/results/vcpo_factorial/protocol.md" and len(rec["commit"]) == 40
