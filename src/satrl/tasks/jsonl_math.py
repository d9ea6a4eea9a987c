"""Math problems from a local JSONL or parquet file, graded with ``math-verify``.

Each row holds a problem and its reference answer (keys ``problem`` and ``answer`` by default), e.g. a
user's copy of AIME24. The prompt is ``prompt_template.format(problem=...)``; a problem given as chat messages
(a list of ``{"role", "content"}`` objects, TRL's conversational format) is the prompt as it is, rendered by the
tokenizer's chat template (``model.chat.template=true``, docs/real-models.md). The reward is 1.0 iff
``math_verify.verify(gold, pred)`` holds, where ``pred = math_verify.parse(completion)`` uses the library's
own extraction (``\\boxed{}`` first, then LaTeX and plain expressions), and the gold answer is parsed once
at load time wrapped as ``\\boxed{answer}`` (unless it already has ``$`` or ``\\boxed``): a bare gold
such as ``3\\pi`` or ``\\sqrt{3}+1`` is otherwise read as ``3`` or not at all.

Malformed rows (bad JSON, invalid UTF-8, a row over :data:`MAX_ROW_BYTES`, not an object, a missing or
empty field, a gold answer math-verify cannot parse, or one whose grading always hits the time limit) are
never silently dropped: they are listed in :attr:`JsonlMathTask.skipped` as
``(line_number, reason)``, summarized by :meth:`JsonlMathTask.report`, and announced with one
``warnings.warn`` at load time.

Splits are by a keyed hash of the problem text, so a duplicated problem always lands in one split:
``eval_fraction=1.0`` (default) makes every row eval (the AIME use), ``0.0`` every row train, and values
in between split deterministically. ``eval`` yields the eval rows in file order (the seed is ignored, so
runs are comparable); ``train`` yields an endless stream of epochs over the train rows, each shuffled by
``(seed, epoch)``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from math_verify import parse, verify

from satrl.tasks import TaskError, check_template
from satrl.tasks.splits import hashed_split
from satrl.types import Problem, Score, check_messages, prompt_text

DEFAULT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
_TIMEOUT_S = 5  # math-verify's own default
MAX_ROW_BYTES = 1_000_000  # a longer row is skipped (and counted): no real problem is a megabyte


MAX_ANSWER_CHARS = 10_000  # only the tail of a completion is graded (where its final answer is)


class _Timeouts(logging.Filter):
    """Counts math-verify's "Timeout during parsing/comparison" records (and drops them: they hold the
    whole, possibly megabyte-long, input)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Timeout during"):
            self.count += 1
            return False
        return True


TIMEOUTS = _Timeouts()
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(TIMEOUTS)


def _timeout(seconds: int = _TIMEOUT_S) -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere run without one
    # (then only MAX_ANSWER_CHARS bounds the work). The engine process and the trainer grade in their main thread.
    return seconds if threading.current_thread() is threading.main_thread() else None


def parse_gold(answer: str, timeout_s: int = _TIMEOUT_S) -> list[Any]:
    """math-verify parse of a reference answer (boxed, so LaTeX without ``$`` is read whole)."""
    text = answer if ("$" in answer or "\\boxed" in answer) else f"\\boxed{{{answer}}}"
    return parse(text, parsing_timeout=_timeout(timeout_s))


def preview(text: str, n: int = 60) -> str:
    """``text`` quoted, cut to ``n`` characters with its length noted: a skipped row's warning stays one short
    line however long the row's answer is."""
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text):,} characters)"


_PROBE: list[Any] = []  # the parse of a plain answer ("1"), made on first use


def grading_times_out(gold: list[Any], timeout_s: int = _TIMEOUT_S) -> bool:
    """Whether comparing ``gold`` with a plain answer hits the time limit: such a gold (e.g. ``10^{10^{10}}``,
    ``99999999!``) makes every grading of its problem time out, so its reward is always 0 at ``timeout_s``
    seconds per sample. Off the main thread there is no time limit to hit (see :func:`_timeout`): False."""
    limit = _timeout(timeout_s)
    if limit is None:
        return False
    if not _PROBE:
        _PROBE.extend(parse("\\boxed{1}"))
    before = TIMEOUTS.count
    verify(gold, _PROBE, timeout_seconds=limit)
    return TIMEOUTS.count > before


def math_equal(gold: list[Any], completion_text: str, timeout_s: int = _TIMEOUT_S) -> bool:
    """Whether the answer math-verify extracts from the last :data:`MAX_ANSWER_CHARS` characters of
    ``completion_text`` equals the parsed ``gold``. Parsing and comparing each stop after ``timeout_s``
    (then the answer is wrong, and :data:`TIMEOUTS` counts it)."""
    text = completion_text[-MAX_ANSWER_CHARS:]
    pred = parse(text, parsing_timeout=_timeout(timeout_s))
    return bool(pred) and verify(gold, pred, timeout_seconds=_timeout(timeout_s))


@dataclass(frozen=True)
class JsonlMathOptions:
    """The jsonl_math task's options: its ``task.kwargs`` (each key a field, with the same default).

    Attributes:
        path: a ``.jsonl`` (or ``.json`` with one object per line) or ``.parquet`` file.
        problem_key, answer_key: row fields holding the problem and the reference answer.
        prompt_template: ``str.format`` template whose one field is ``{problem}`` (a literal brace: ``{{``, ``}}``).
        eval_fraction: share of rows in the eval split, in [0, 1]; training needs both splits, so a run's
            config refuses 0 and 1 (the default, 1.0, makes every row eval: for ``satrl eval``).
        split_key: key of the split hash.
        verify_timeout_s: seconds (integer >= 1) math-verify may spend parsing, and again comparing, one
            answer; past it the reward is 0 and :attr:`JsonlMathTask.timeouts` counts it.
    """

    path: str | Path
    problem_key: str = "problem"
    answer_key: str = "answer"
    prompt_template: str = DEFAULT_TEMPLATE
    eval_fraction: float = 1.0
    split_key: str = "satrl-jsonl-v1"
    verify_timeout_s: int = _TIMEOUT_S


class JsonlMathTask:
    """Local JSONL / parquet math set with a math-verify reward; see the module docstring.

    Args:
        options: the task's settings (:class:`JsonlMathOptions`, what ``task.kwargs`` build); checked here, each
            bad value (or a missing file) refused in one line.
    """

    def __init__(self, options: JsonlMathOptions) -> None:
        path, problem_key, answer_key = options.path, options.problem_key, options.answer_key
        prompt_template, eval_fraction, split_key = options.prompt_template, options.eval_fraction, options.split_key
        verify_timeout_s = options.verify_timeout_s
        self.options = options
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"jsonl_math: {str(self.path)!r} is a directory, not a .jsonl or .parquet file")
        if not self.path.is_file():
            raise FileNotFoundError(f"jsonl_math: no such file {str(self.path)!r} (expected a .jsonl or .parquet file)")
        check_template(prompt_template, "problem")
        if not 0.0 <= eval_fraction <= 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
        self.problem_key, self.answer_key = problem_key, answer_key
        self.prompt_template = prompt_template
        self.eval_fraction = eval_fraction
        self.split_key = split_key
        if not (isinstance(verify_timeout_s, int) and verify_timeout_s >= 1):
            raise ValueError(f"verify_timeout_s must be an integer >= 1, got {verify_timeout_s!r}")
        self.verify_timeout_s = verify_timeout_s
        self.timeouts = 0  # answers whose grading hit the time limit (reward 0)
        self.name = f"jsonl_math({self.path.name})"
        self.skipped: list[tuple[int, str]] = []
        self._gold: dict[str, list[Any]] = {}
        self._splits: dict[str, list[Problem]] = {"train": [], "eval": []}
        for line_no, row in self._read_rows():
            problem = self._check_row(line_no, row)
            if problem is not None:
                self._splits[self._split_of(problem)].append(problem)
        n_ok = len(self._splits["train"]) + len(self._splits["eval"])
        if n_ok == 0:
            raise ValueError(f"jsonl_math: no usable rows. {self.report()}")
        if self.skipped:
            warnings.warn(self.report(), stacklevel=2)

    # ----------------------------------------------------------------------------- loading
    def _read_rows(self) -> Iterator[tuple[int, Any]]:
        """(1-based line or row number, row) pairs; a bad JSON line is recorded and yields nothing."""
        suffix = self.path.suffix.lower()
        if suffix == ".parquet":
            if importlib.util.find_spec("pyarrow") is None:
                raise ImportError(f"reading {self.path} needs pyarrow: run `pip install pyarrow` (or convert to JSONL)")
            import pandas as pd

            try:
                records = pd.read_parquet(self.path).to_dict(orient="records")
            except Exception as e:  # pyarrow's errors for a corrupt or non-parquet file
                raise ValueError(f"jsonl_math: cannot read {self.path} as parquet ({str(e).splitlines()[0]})") from e
            for row_no, row in enumerate(records, start=1):
                text_len = sum(len(v) for v in row.values() if isinstance(v, str))
                if text_len > MAX_ROW_BYTES:
                    self.skipped.append((row_no, f"longer than {MAX_ROW_BYTES:,} characters"))
                    continue
                yield row_no, row
            return
        if suffix not in (".jsonl", ".json", ".ndjson"):
            raise ValueError(f"jsonl_math: {self.path}: unsupported file type {suffix!r}; valid choices: .jsonl, .json, .ndjson, .parquet")
        with self.path.open("rb") as f:
            for line_no, raw in enumerate(f, start=1):
                if len(raw) > MAX_ROW_BYTES:
                    self.skipped.append((line_no, f"longer than {MAX_ROW_BYTES:,} bytes"))
                    continue
                try:
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    self.skipped.append((line_no, f"invalid UTF-8 at byte {e.start}"))
                    continue
                if not line.strip():
                    continue  # blank lines (e.g. a trailing newline) are not rows
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as e:
                    self.skipped.append((line_no, f"bad JSON ({e.msg})"))
                except RecursionError:
                    self.skipped.append((line_no, "bad JSON (nested too deeply)"))

    def _field(self, row: dict[str, Any], key: str) -> str | None:
        value = row.get(key)
        if value is None or isinstance(value, (dict, list, bool)):
            return None
        if isinstance(value, float) and value != value:  # NaN, as pandas writes a missing cell
            return None
        text = str(value).strip()
        return text if any(c.isprintable() and not c.isspace() for c in text) else None  # NULs alone are empty

    def _check_row(self, line_no: int, row: Any) -> Problem | None:
        if not isinstance(row, dict):
            self.skipped.append((line_no, f"not a JSON object ({type(row).__name__})"))
            return None
        messages = row.get(self.problem_key)
        if type(messages).__name__ == "ndarray":  # a parquet list column, as pandas reads it
            messages = messages.tolist()
        if isinstance(messages, list):  # a conversational prompt: checked here, rendered by the chat template
            try:
                messages = check_messages(messages)
            except ValueError as e:
                self.skipped.append((line_no, f"{preview(self.problem_key)}: {e}"))
                return None
        else:
            messages = None
        for key in (self.answer_key,) if messages else (self.problem_key, self.answer_key):
            if self._field(row, key) is None:
                self.skipped.append((line_no, f"missing or empty {preview(key)}"))
                return None
        for key in (self.answer_key,) if messages else (self.problem_key, self.answer_key):
            try:
                str(self._field(row, key)).encode("utf-8")
            except UnicodeEncodeError as e:  # a \ud800 escape: JSON parses it, no encoder takes it
                self.skipped.append((line_no, f"{preview(key)} holds a lone surrogate (\\u{ord(e.object[e.start]):04x} "
                                              f"escape at character {e.start}), not text"))  # fmt: skip
                return None
        answer = self._field(row, self.answer_key)
        assert answer is not None
        gold = parse_gold(answer, self.verify_timeout_s)
        if not gold:
            self.skipped.append((line_no, f"answer {preview(answer)} not parseable by math-verify"))
            return None
        if grading_times_out(gold, self.verify_timeout_s):
            self.skipped.append((line_no, f"answer {preview(answer)}: grading it hits the {self.verify_timeout_s} s "
                                          "time limit (verify_timeout_s), so its reward would always be 0"))  # fmt: skip
            return None
        pid = f"{self.path.stem}:{line_no}"
        self._gold[pid] = gold
        prompt = messages or self.prompt_template.format(problem=self._field(row, self.problem_key))
        return Problem(id=pid, prompt=prompt, answer=answer)

    def _split_of(self, problem: Problem) -> str:
        if self.eval_fraction >= 1.0:
            return "eval"
        return hashed_split(prompt_text(problem.prompt), self.split_key, self.eval_fraction)

    def report(self) -> str:
        """One line: rows kept, rows skipped and the first skipped line numbers with reasons."""
        kept = {k: len(v) for k, v in self._splits.items()}
        msg = f"{self.path}: kept {kept['train'] + kept['eval']} rows (train {kept['train']}, eval {kept['eval']})"
        if not self.skipped:
            return msg
        first = "; ".join(f"line {n}: {why}" for n, why in self.skipped[:5])
        more = f"; ... {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        return f"{msg}, skipped {len(self.skipped)} malformed rows ({first}{more})"

    # ----------------------------------------------------------------------------- Task protocol
    def problems(self, split: str, seed: int = 0) -> Iterator[Problem]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; valid choices: {sorted(self._splits)}")
        rows = self._splits[split]
        if not rows:  # a TaskError: one line, also where the engine process meets it
            raise TaskError(
                f"{self.name} has no {split} rows (eval_fraction={self.eval_fraction}); "
                "set eval_fraction strictly between 0 and 1 to have both splits"
            )
        if split == "eval":
            return iter(rows)
        return self._train_stream(rows, seed)

    @staticmethod
    def _train_stream(rows: list[Problem], seed: int) -> Iterator[Problem]:
        epoch = 0
        while True:
            order = list(rows)
            random.Random(f"train-{seed}-{epoch}").shuffle(order)
            yield from order
            epoch += 1

    def reward(self, problem: Problem, completion_text: str) -> float:
        return self.score(problem, completion_text).reward

    def score(self, problem: Problem, completion_text: str) -> Score:
        """The reward, and whether grading hit ``verify_timeout_s`` (then the reward is 0)."""
        gold = self._gold.get(problem.id)
        if gold is None:  # a Problem built elsewhere: parse its answer now
            gold = parse_gold(problem.answer)
        before = TIMEOUTS.count
        ok = math_equal(gold, completion_text, self.verify_timeout_s)
        timed_out = TIMEOUTS.count > before
        self.timeouts += TIMEOUTS.count - before
        return Score(1.0 if ok else 0.0, timed_out)
