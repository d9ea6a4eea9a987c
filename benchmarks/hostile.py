"""Hostile inputs for the chaos suite: malformed datasets and configs, and what a clean outcome is for each.

A dataset is clean when ``make_task('jsonl_math', path=...)`` either loads and counts exactly the bad rows
it skipped (``("skip", n)``), or raises :class:`~satrl.tasks.TaskError` with one line naming the file and,
where a line is at fault, ``line N`` (``("exit2", line)``). A config is clean when ``load_config`` raises
:class:`~satrl.config.ConfigError` with one line naming the offending key.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

GOOD = '{"problem": "1+1?", "answer": "2"}\n'
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None


def _text(name: str, text: str | bytes) -> Callable[[Path], tuple[Path, tuple]]:
    def make(d: Path, expect: tuple) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        p = d / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p

    return make


def _parquet(name: str, rows: list[dict] | None) -> Callable[[Path, tuple], Path]:
    def make(d: Path, expect: tuple) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        p = d / name
        if rows is None or not HAS_PYARROW:  # without pyarrow every parquet is refused with one line
            p.write_bytes(b"PAR1 this is not parquet")
        else:
            import pandas as pd

            pd.DataFrame(rows).to_parquet(p)
        return p

    return make


def _dir(d: Path, expect: tuple) -> Path:
    (d / "a_directory.jsonl").mkdir(parents=True, exist_ok=True)
    return d / "a_directory.jsonl"


# name -> (builder, expected outcome)
BAD_DATASETS: dict[str, tuple[Callable, tuple]] = {
    "empty file": (_text("empty.jsonl", ""), ("exit2", None)),
    "only blank lines": (_text("blank.jsonl", "\n \n\t\n"), ("exit2", None)),
    "all rows malformed": (_text("bad.jsonl", '{"question": "1+1", "answer": "2"}\n{"question": 5}\nnot json\n'), ("exit2", 1)),
    "missing answer": (_text("noanswer.jsonl", GOOD + '{"problem": "2+2?"}\n'), ("skip", 1)),
    "empty problem": (_text("emptyproblem.jsonl", GOOD + '{"problem": "", "answer": "3"}\n'), ("skip", 1)),
    "whitespace answer": (_text("wsanswer.jsonl", GOOD + '{"problem": "x", "answer": "  \\t"}\n'), ("skip", 1)),
    "wrong types": (_text("types.jsonl", GOOD + '{"problem": ["a"], "answer": "1"}\n{"problem": "a", "answer": {"x": 1}}\n'
                          '{"problem": "b", "answer": true}\n'), ("skip", 3)),
    "number answer": (_text("numanswer.jsonl", GOOD + '{"problem": "3+4?", "answer": 7}\n'), ("skip", 0)),
    "blank lines between rows": (_text("gaps.jsonl", "\n" + GOOD + "\n\n" + GOOD.replace("1+1", "1+2").replace('"2"', '"3"') + "\n"), ("skip", 0)),
    "invalid UTF-8": (_text("utf8.jsonl", GOOD.encode() + b'{"problem": "\xff\xfe", "answer": "1"}\n'), ("skip", 1)),
    "10 MB line": (_text("huge.jsonl", GOOD + json.dumps({"problem": "x" * 10_000_000, "answer": "1"}) + "\n"), ("skip", 1)),
    "duplicate rows": (_text("dups.jsonl", GOOD * 3), ("skip", 0)),
    "row is an array": (_text("array.jsonl", GOOD + "[1, 2]\n"), ("skip", 1)),
    "row is null": (_text("null.jsonl", GOOD + "null\n"), ("skip", 1)),
    "NaN field": (_text("nan.jsonl", GOOD + '{"problem": NaN, "answer": "1"}\n'), ("skip", 1)),
    "deeply nested row": (_text("deep.jsonl", GOOD + "[" * 100_000 + "]" * 100_000 + "\n"), ("skip", 1)),
    "gold grading always times out": (_text("slowgold.jsonl", GOOD + '{"problem": "big?", "answer": "99999999!"}\n'), ("skip", 1)),
    "1 MB unparseable answer": (_text("longanswer.jsonl", GOOD + json.dumps({"problem": "x", "answer": "\\boxed{" + "@" * 900_000}) + "\n"),
                                ("skip", 1)),
    "torn last line": (_text("torn.jsonl", GOOD + '{"problem": "2+2?", "ans'), ("skip", 1)),
    "byte-order mark": (_text("bom.jsonl", "\ufeff" + GOOD), ("skip", 0)),
    "CRLF line ends": (_text("crlf.jsonl", GOOD.replace("\n", "\r\n") * 2), ("skip", 0)),
    "NUL bytes": (_text("nul.jsonl", GOOD + '{"problem": "\\u0000", "answer": "\\u0000"}\n' + "\0\0\0\n"), ("skip", 2)),
    "a directory": (_dir, ("exit2", None)),
    "wrong extension": (_text("data.txt", GOOD), ("exit2", None)),
    "parquet: not parquet": (_parquet("corrupt.parquet", None), ("exit2", None)),
    "parquet: null cells": (_parquet("nulls.parquet", [{"problem": "1+1?", "answer": "2"}, {"problem": None, "answer": "1"}]),
                            ("skip", 1) if HAS_PYARROW else ("exit2", None)),
    "parquet: missing column": (_parquet("nocol.parquet", [{"problem": "1+1?"}]), ("exit2", 1) if HAS_PYARROW else ("exit2", None)),
}


def check_dataset(d: Path, name: str) -> str | None:
    """None if the dataset ``name`` has its clean outcome; else what went wrong."""
    import warnings

    from satrl.tasks import TaskError, make_task

    build, (kind, n) = BAD_DATASETS[name]
    path = build(d / name.replace(" ", "_").replace(":", ""), (kind, n))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            task = make_task("jsonl_math", path=str(path))
    except TaskError as e:
        msg = str(e)
        if kind != "exit2":
            return f"{name}: refused, expected to skip {n} rows: {msg[:300]}"
        if "\n" in msg or str(path) not in msg:
            return f"{name}: message is not one line naming {path}: {msg[:300]}"
        if n is not None and f"line {n}" not in msg:
            return f"{name}: message does not name line {n}: {msg[:300]}"
        return None
    except BaseException as e:  # anything else would be a traceback
        return f"{name}: {type(e).__name__}: {str(e)[:300]}"
    if kind != "skip":
        return f"{name}: loaded, expected a refusal"
    if len(task.skipped) != n:
        return f"{name}: skipped {len(task.skipped)} rows, expected {n}: {task.report()[:300]}"
    if len(task.report()) > 1000:  # the load-time warning quotes previews, never whole rows
        return f"{name}: the skipped-rows warning is {len(task.report()):,} characters long"
    return None


# (YAML file text or None, overrides, key the one-line error must name)
BAD_CONFIGS: list[tuple[str | None, list[str], str]] = [
    ("", ["steps=abc"], "steps"),
    ("- 1\n- 2\n", [], "mapping"),
    ("just a string\n", [], "mapping"),
    ("steps: [1, 2\n", [], "YAML"),
    ("train:\n  lr: -1\n", [], "train.lr"),
    ("train: 5\n", [], "train"),
    ("bogus: 1\n", [], "bogus"),
    (None, ["train.nope=1"], "nope"),
    (None, ["steps=1e999"], "steps"),
    (None, ["steps=99999999999999999999999999999999"], "steps"),
    (None, ["seed=ü"], "seed"),
    (None, ["lag.schedule=ünïcode"], "lag.schedule"),
    (None, ["steps"], "steps"),
    (None, ["=3"], "=3"),
    (None, ["steps.x=1"], "steps"),
    (None, ["train..lr=1"], "train..lr"),
    (None, ["objective.alpha=[1, 2]"], "alpha"),
    (None, ["objective.name=nope"], "nope"),
    (None, ["engine.temperature=0"], "engine.temperature"),
    (None, ["train.lr=inf"], "train.lr"),
    (None, ["engine.timeout_s=-1"], "engine.timeout_s"),
    (None, ["task.kwargs=3"], "task.kwargs"),
    ("\x00\x01binary", [], "YAML"),
    ("a: &x [*x]\n", [], "a"),
    # issue 46, items 7-8: sizes that cannot fit, devices, seeds and numbers out of range, split fractions
    (None, ["train.prompts_per_batch=1000000000"], "train.prompts_per_batch"),
    (None, ["train.prompts_per_batch=100000", "train.group_size=100"], "train.prompts_per_batch"),
    (None, ["train.group_size=1000000000"], "train.group_size"),
    (None, ["train.device=meta"], "train.device"),
    (None, ["train.device=bogus"], "train.device"),
    (None, ["seed=9223372036854775807"], "seed"),
    (None, ["objective.trust_region.eps_high=1e308"], "trust_region.eps_high"),
    (None, ["objective.trust_region.dual_clip=1e308"], "trust_region.dual_clip"),
    (None, ["task.name=jsonl_math", "task.kwargs.path=x.jsonl", "task.kwargs.eval_fraction=1"], "task.kwargs.eval_fraction"),
    (None, ["task.name=jsonl_math", "task.kwargs.path=x.jsonl", "task.kwargs.eval_fraction=0"], "task.kwargs.eval_fraction"),
]


def check_config(d: Path, text: str | None, overrides: list[str], key: str) -> str | None:
    from satrl.config import ConfigError, load_config

    path = None
    if text is not None:
        d.mkdir(parents=True, exist_ok=True)
        path = d / "cfg.yaml"
        path.write_text(text)
    try:
        load_config(path, overrides)
    except ConfigError as e:
        msg = str(e)
        if "\n" in msg or key not in msg:
            return f"{text!r} {overrides}: message is not one line naming {key!r}: {msg[:300]}"
        return None
    except BaseException as e:
        return f"{text!r} {overrides}: {type(e).__name__}: {str(e)[:300]}"
    return f"{text!r} {overrides}: accepted"


# -- damaged checkpoints: `satrl train --resume` must end with one line naming the checkpoint, exit 2 -------------
def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _edit_tree(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(p: Path) -> None:
        tree = json.loads(p.read_text())
        p.write_text(json.dumps(change(tree)))

    return damage


def _zero_block(p: Path) -> None:
    """A block of zeros in the middle of the file: still a readable safetensors file, with other numbers."""
    data = bytearray(p.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    p.write_bytes(bytes(data))


def _flip_bit(find: bytes, offset: int = 0, bit: int = 0) -> Callable[[Path], None]:
    """One bit flipped in the byte ``offset`` past the first ``find``."""

    def damage(p: Path) -> None:
        data = bytearray(p.read_bytes())
        data[data.index(find) + offset] ^= 1 << bit
        p.write_bytes(bytes(data))

    return damage


def _flip_number(key: str) -> Callable[[Path], None]:
    """The last digit of the number after JSON key ``key`` one bit off: still a digit, so the file parses and
    holds another value (a learning rate, a reward)."""

    def damage(p: Path) -> None:
        data = bytearray(p.read_bytes())
        m = re.search(rb'"' + key.encode() + rb'": *-?[0-9][0-9.eE+-]*', data)
        data[m.end() - 1] ^= 1
        p.write_bytes(bytes(data))

    return damage


def _drop_entry(name: str) -> Callable[[dict], dict]:
    return lambda t: {**t, "files": {k: v for k, v in t["files"].items() if k != name}}


def _set_next_batch(tree: dict) -> dict:
    tree["run"]["fields"]["next_batch"] = "one"
    return tree


# name -> (file of the latest checkpoint, damage)
BAD_CHECKPOINTS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "model.safetensors truncated": ("model.safetensors", _truncate),
    "model.safetensors not safetensors": ("model.safetensors", lambda p: p.write_text("hello, not a tensor file")),
    "model.safetensors empty": ("model.safetensors", lambda p: p.write_bytes(b"")),
    "model.safetensors block zeroed": ("model.safetensors", _zero_block),  # caught by its checksum
    "state.safetensors block zeroed": ("state.safetensors", _zero_block),
    "state.safetensors truncated": ("state.safetensors", _truncate),
    "state.json a list": ("state.json", lambda p: p.write_text("[1, 2]")),
    "state.json not JSON": ("state.json", lambda p: p.write_text("{")),
    "state.json run is a number": ("state.json", _edit_tree(lambda t: {**t, "run": 5})),
    "state.json trainer is a string": ("state.json", _edit_tree(lambda t: {**t, "trainer": "x"})),
    "state.json next_batch a string": ("state.json", _edit_tree(_set_next_batch)),
    # issue 46, item 3: state.json and the manifest are covered too
    "state.json lr one bit off": ("state.json", _flip_number("lr")),
    "state.json gains files_sha256": ("state.json", _edit_tree(lambda t: {**t, "files_sha256": {}})),
    "manifest.json key one bit off": ("manifest.json", _flip_bit(b'"files"', 1)),
    "manifest.json self_sha256 one bit off": ("manifest.json", _flip_bit(b'"self_sha256":"', len(b'"self_sha256":"'))),
    "manifest.json format one bit off": ("manifest.json", _flip_bit(b'"format":', len(b'"format":'), bit=1)),
    "manifest.json entry removed": ("manifest.json", _edit_tree(_drop_entry("state.json"))),
    "manifest.json emptied": ("manifest.json", lambda p: p.write_bytes(b"")),
}


def check_checkpoint(finished: Path, d: Path, name: str) -> str | None:
    """None if ``satrl train --resume`` of a copy of the run ``finished`` (summary.json removed), its latest
    checkpoint damaged as ``name`` says, exits 2 with one line naming the checkpoint; else what went wrong."""
    import contextlib
    import io
    import shutil

    from satrl import cli

    out = d / name.replace(" ", "_")
    shutil.copytree(finished, out)
    (out / "summary.json").unlink(missing_ok=True)
    file, damage = BAD_CHECKPOINTS[name]
    step = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    before = (step / file).read_bytes()
    damage(step / file)
    if (step / file).read_bytes() == before:
        return f"{name}: the damage changed nothing"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = cli.main(["train", "--resume", str(out), "--no-progress"])
    except BaseException as e:  # a traceback
        return f"{name}: {type(e).__name__}: {str(e)[:300]}"
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    if rc != 2 or len(lines) != 1 or str(step) not in lines[0]:
        return f"{name}: exit {rc}, expected 2 and one line naming {step}: {lines[:3]}"
    return None
