"""Docs that cannot rot: every fenced block of README.md and docs/*.md is checked here.

- Every fence names its language: python, bash, yaml, json or text (a diagram, a file tree).
- A python or bash block runs as printed, in a scratch folder that sees the repository's configs/ and docs/,
  unless the line before its fence is ``<!-- doc-test: check REASON -->``: a block that needs a GPU, a cluster, a
  download or hours of compute. Such a block is only checked: python compiles, bash parses (``bash -n``), and each
  ``satrl`` command in it parses with satrl's own parser; a ``satrl train`` resolves its config
  (``--print-config``) and a ``satrl grid`` expands (``--dry-run``), so a renamed key or file fails here.

Each python block and each plain ``satrl ...`` line (no shell syntax: pipe, redirect, variable, glob, quote
escapes) runs in a process of its own forked from one that imported satrl's command line and TRL once
(tests/doc_runner.py; a fresh interpreter pays ~4 s of CPU for satrl's imports, ~8 s for TRL's): ``satrl ARGV`` through
the console script's entry point, a python block as ``python -c`` runs it. Every other line goes through
``bash -euo pipefail``, line by line; a block with a line that hands shell state to the next (``cd``, a variable,
a loop, a here-document) runs whole in bash. The first line that fails fails the block, as ``bash -e`` would.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from doc_runner import DocRunner
from run_helpers import CLI_PRELOAD

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


# What the docs' commands import first: satrl's command line (and the leaderboard's), TRL and satrl's TRL plug-ins.
PRELOAD = [*CLI_PRELOAD, "satrl.experiments.across", "datasets", "trl", "satrl.integrations.trl",
           "satrl.integrations.trl_vcpo", "satrl.integrations.trl_baselines"]  # fmt: skip


@pytest.fixture(scope="module")
def runner():
    server = DocRunner(PRELOAD, _env())
    yield server
    server.close()


SHELL_SYNTAX = set("|&;<>()$`\\*?[]{}~!")
# first words of a line that hands shell state to the next line (or spans lines): such a block runs whole in bash
STATEFUL = {"cd", "pushd", "popd", "export", "unset", "source", ".", "set", "shopt", "alias", "eval", "exec", "trap",
            "umask", "declare", "local", "readonly", "let", "for", "while", "until", "if", "case", "select",
            "function", "{", "(", "then", "do", "done", "fi", "esac"}  # fmt: skip


def _steps(lang: str, body: str) -> list[tuple[str, object]]:
    """How a block runs: ``("python", code)``, ``("satrl", argv)`` or ``("bash", text)``, in order."""
    if lang == "python":
        return [("python", body)]
    lines = [x for x in body.replace("\\\n", " ").splitlines() if x.strip() and not x.lstrip().startswith("#")]
    if "<<" in body or any(x.split()[0] in STATEFUL or re.match(r"\w+=", x.strip()) for x in lines):
        return [("bash", body)]
    steps: list[tuple[str, object]] = []
    for line in lines:
        command = line.split(" #")[0]
        try:
            words = shlex.split(command)
            plain = words == shlex.split(line, comments=True) and not SHELL_SYNTAX & set(command)
        except ValueError:  # an unbalanced quote: bash says what is wrong
            plain = False
        steps.append(("satrl", words[1:]) if plain and words[0] == "satrl" else ("bash", line))
    return steps


def _run_block(runner: DocRunner, cwd: Path, where: str, lang: str, body: str) -> None:
    for kind, what in _steps(lang, body):
        if kind == "python":
            out = runner.python(what, cwd)
        elif kind == "satrl":
            out = runner.satrl(what, cwd)
        else:
            out = subprocess.run(["bash", "-euo", "pipefail", "-c", what], cwd=cwd, env=_env(), capture_output=True,
                                 text=True, timeout=600)  # fmt: skip
        shown = what if kind == "bash" else "satrl " + " ".join(what) if kind == "satrl" else "the block"
        assert out.returncode == 0, f"{where}: `{shown[:200]}` exited {out.returncode}: {out.stderr[-2000:]}"


@pytest.mark.parametrize("where,lang,mark,body", [b for b in CODE if not b[2]], ids=lambda x: x if ":" in str(x) else "")
def test_block_runs_as_printed(runner, tmp_path, where, lang, mark, body):
    _run_block(runner, _scratch(tmp_path), where, lang, body)


def test_the_runner_fails_on_a_failing_line(runner, tmp_path):
    """Each way a line runs can fail the block: a satrl command's exit code, a bash line's, a python block's
    exception or exit code; and a failing line stops the block (the line after it does not run)."""
    assert [k for k, _ in _steps("bash", "satrl eval --help\nsatrl x | grep y\nA=1\n")] == ["bash"]
    assert [k for k, _ in _steps("bash", "satrl eval --help  # a comment\nls *.md\n")] == ["satrl", "bash"]
    for lang, body in (("bash", "satrl train configs/nope.yaml\ntouch ran"), ("bash", "false\ntouch ran"),
                       ("python", "raise ValueError('x')"), ("python", "import sys; sys.exit(3)")):  # fmt: skip
        with pytest.raises(AssertionError, match="exited [123]"):
            _run_block(runner, tmp_path, "x:1", lang, body)
        assert not (tmp_path / "ran").exists()


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
def test_checked_block_parses_and_its_satrl_commands_resolve(runner, tmp_path, where, lang, mark, body):
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
        out = runner.satrl(check, cwd)
        assert out.returncode == 0, f"{where}: `{line}`: {out.stderr[-1500:]}"


def test_the_checker_fails_on_a_rotted_command(runner, tmp_path):
    """The check can fail: a renamed key, a missing required option and a missing file are all caught."""
    for body in ("satrl train configs/sat_grpo.yaml objective.alpah=0.8", "satrl pretrain --model tiny-arith",
                 "satrl grid configs/grids/nope.yaml"):  # fmt: skip
        scratch = tmp_path / str(len(body))
        scratch.mkdir()
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            test_checked_block_parses_and_its_satrl_commands_resolve(runner, scratch, "x:1", "bash", "check test", body)
