"""Strict-JSON lines: one writer and one tolerant reader for every ``.jsonl`` file satrl writes or reads.

Writing: every non-finite float (NaN, +-inf) becomes ``null``, so each line is valid JSON for strict
parsers (jq, browsers); ``allow_nan=False`` makes sure none slips through. Reading: blank lines and lines
that do not parse as a JSON object are skipped (a run killed while appending leaves a torn last line), so
a reader never dies on a half-written file. Old files with bare ``NaN`` still read (Python's parser accepts
it). ``null_as_nan=True`` turns ``null`` values back into NaN, the in-memory meaning of an undefined metric.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (also inside lists and dicts) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads``, where a document nested too deeply for the parser (a hostile ``state.json`` of 200k
    levels) is a ValueError like any other malformed JSON, not a RecursionError and a traceback (issue 60)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def dumps(row: dict[str, Any]) -> str:
    """One line of strict JSON (no trailing newline)."""
    return json.dumps(strict(row), allow_nan=False)


def read_jsonl(path: str | Path, null_as_nan: bool = False) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` or ``.jsonl.gz`` file; a missing file is no rows, unparsable lines are skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = loads(line)
            except ValueError:  # a torn line: the writer was killed mid-append
                continue
            if isinstance(row, dict):
                rows.append({k: math.nan if v is None else v for k, v in row.items()} if null_as_nan else row)
    return rows


def numbered_rows(path: str | Path) -> list[tuple[int, dict[str, Any] | None]]:
    """``(line number, row)`` for each non-blank line of a plain ``.jsonl`` file, row None where the line is
    not a JSON object: for a reader that must tell a torn last line (a kill mid-append) from damage inside
    the file, which :func:`read_jsonl` skips alike."""
    path = Path(path)
    if not path.is_file():
        return []
    out: list[tuple[int, dict[str, Any] | None]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = loads(line)
            except ValueError:
                row = None
            out.append((n, row if isinstance(row, dict) else None))
    return out


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` with ``rows`` atomically (a temporary file renamed into place)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    """Append one row as a single write, so a kill leaves at most one torn (skipped) last line."""
    try:
        with open(path, "a") as f:
            f.write(dumps(row) + "\n")
    except OSError as e:  # e.g. disk full: name the file (the OS error from a buffered write does not)
        raise OSError(e.errno, f"{e.strerror} writing {path}") from e
