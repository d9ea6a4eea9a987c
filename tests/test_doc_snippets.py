"""Docs that cannot rot: every fenced block of README.md and docs/*.md is checked here.

- Every fence names its language: python, bash, yaml, json or text (a diagram, a file tree).
- A python or bash block runs as printed, in a scratch folder that sees the repository's configs/ and docs/,
  unless the line before its fence is ``<!-- doc-test: check REASON -->``: a block that needs a GPU, a cluster, a
  download or hours of compute. Such a block is only checked: python compiles, bash parses (``bash -n``), and each
  ``satrl`` command in it parses with satrl's own parser; a ``satrl train`` resolves its config
  (``--print-config``) and a ``satrl grid`` expands (``--dry-run``), so a renamed key or file fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:<!-- doc-test: (?P<mark>[^\n]*?) -->\n)?```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```", re.M | re.S)
LANGS = {"python", "bash", "yaml", "json", "text"}
BIN = Path(sys.executable).parent


def _blocks() -> list[tuple[str, str, str, str]]:
    """(where, language, marker, body) of every fenced block; where = file:line of the fence."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            out.append((f"{doc.relative_to(REPO)}:{line}", m["lang"].strip(), m["mark"] or "", m["body"]))
    return out


BLOCKS = _blocks()
CODE = [b for b in BLOCKS if b[1] in ("python", "bash")]


def test_every_fence_names_its_language():
    bad = [where for where, lang, _, _ in BLOCKS if lang not in LANGS]
    assert not bad, f"fences without a known language ({sorted(LANGS)}): {bad}"
    assert all(mark.startswith("check ") and len(mark) > 10 for _, _, mark, _ in BLOCKS if mark), \
        "a doc-test marker is `<!-- doc-test: check REASON -->`, with the reason"


def _scratch(tmp_path: Path) -> Path:
    for name in ("configs", "docs"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("where,lang,mark,body", [b for b in CODE if not b[2]], ids=lambda x: x if ":" in str(x) else "")
def test_block_runs_as_printed(tmp_path, where, lang, mark, body):
    cmd = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
    out = subprocess.run(cmd, cwd=_scratch(tmp_path), env=_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{where}: {out.stderr[-2000:]}"


def _commands(body: str) -> list[str]:
    """The shell lines of a block, continuation lines joined and comments dropped."""
    joined = body.replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _satrl_check(argv: list[str], cwd: Path) -> list[str] | None:
    """How to check one satrl command without running it: its own parser, then what it reads."""
    if argv[0] == "train" and not any(a.startswith("--resume") for a in argv):
        return [*argv, "--print-config"]
    if argv[0] == "grid":
        return [*argv, "--dry-run", "--out", str(cwd / "grid-out")]
    return None


@pytest.mark.parametrize("where,lang,mark,body", [b for b in CODE if b[2]], ids=lambda x: x if ":" in str(x) else "")
def test_checked_block_parses_and_its_satrl_commands_resolve(tmp_path, where, lang, mark, body):
    if lang == "python":
        compile(body, where, "exec")
        return
    parsed = subprocess.run(["bash", "-n", "-c", body], capture_output=True, text=True)
    assert parsed.returncode == 0, f"{where}: {parsed.stderr}"
    from satrl.cli import parse_args

    cwd = _scratch(tmp_path)
    for line in _commands(body):
        words = shlex.split(line)
        if not words or words[0] != "satrl" or "..." in words or len(words) < 2:
            continue  # not satrl, or a placeholder (`satrl train ... engine=vllm`)
        try:
            parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"{where}: `{line}` does not parse (exit {e.code})")
        check = _satrl_check(words[1:], cwd)
        if check is None:
            continue
        out = subprocess.run([sys.executable, "-m", "satrl", *check], cwd=cwd, env=_env(), capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, f"{where}: `{line}`: {out.stderr[-1500:]}"


def test_the_checker_fails_on_a_rotted_command(tmp_path):
    """The check can fail: a renamed key, a missing required option and a missing file are all caught."""
    for body in ("satrl train configs/sat_grpo.yaml objective.alpah=0.8", "satrl pretrain --model tiny-arith",
                 "satrl grid configs/grids/nope.yaml"):  # fmt: skip
        scratch = tmp_path / str(len(body))
        scratch.mkdir()
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            test_checked_block_parses_and_its_satrl_commands_resolve(scratch, "x:1", "bash", "check test", body)
