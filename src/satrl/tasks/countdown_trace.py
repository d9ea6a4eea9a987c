"""Countdown with search traces (``task.name=countdown_trace``): a task family whose responses are long and exact.

Prompt ``"13 2 14 to 91:"``: the numbers in the order drawn, then the target. The reference completion
(``Problem.answer``, what ``satrl pretrain`` teaches) is the depth-first trace of
:mod:`satrl.tasks.countdown_solver`, e.g. ``"13+2=15: 29 1 210, ..., 14*13=182: 184 180 364 182/2=91 ok. answer:
(14*13)/2"``. The reward is 1 iff the text after the completion's last ``answer:`` is an expression that uses every
number exactly once and equals the target exactly (reasoning-gym's countdown rules; the trace before it is not
scored), else 0.

Problems are drawn as reasoning-gym draws countdown's: ``n`` numbers uniform in ``[min_value, max_value]``, combined
left to right by random operators (``/`` only when exact, ``-`` in its place otherwise, as reasoning-gym falls back),
the value kept as the target if it lies in ``[min_target, max_target]``, the numbers shuffled. A draw is kept only if
the solver reaches the target and its trace, EOS included, is at most ``max_trace_tokens`` tokens, so that every
problem has a reference trace that fits the context (the defaults: prompt <= 16 tokens with BOS, + 240 = 256).

Splits, as the arithmetic task's (the logic all tasks share: :mod:`satrl.tasks.splits`). Each problem
``(sorted numbers, target)`` belongs to one split by a keyed hash of
that key (so the same numbers in another order are the same problem, in the same split): a fraction
``eval_fraction`` of the space is eval, the rest train, whatever the seeds.
- ``eval``: ``n_eval`` problems with distinct keys from the eval partition, the same for every seed by default
  (``eval_seed=0``; ``eval_seed=None``: drawn from the seed given to :meth:`problems`).
- ``train``: an endless stream (or ``n_train`` problems) drawn i.i.d. from the train partition, fixed by the seed.

``python -m satrl.tasks.countdown_trace`` prints the length statistics (docs/tasks.md quotes them).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, replace

from satrl.tasks.countdown_solver import check_answer, final_answer, solve
from satrl.tasks.splits import SPLITS, Splits, counted, distinct, excluded_keys, hashed_split
from satrl.types import Problem

PROMPT = re.compile(r"^(\d+(?: \d+)+) to (\d+):$")
# The context the defaults fit: a prompt of at most 16 tokens (BOS included) + max_trace_tokens=240. The recipes
# tiny-countdown(-moe) of `satrl pretrain` build their models with this many positions.
CONTEXT = 256
__all__ = ["CONTEXT", "SPLITS", "CountdownTraceOptions", "CountdownTraceTask", "parse_prompt", "prompt_of"]


def prompt_of(numbers: list[int] | tuple[int, ...], target: int) -> str:
    return f"{' '.join(map(str, numbers))} to {target}:"


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """``(numbers, target)`` of a prompt this task wrote; ValueError for any other text."""
    m = PROMPT.match(prompt)
    if m is None:
        raise ValueError(f"not a countdown_trace prompt: {prompt!r}")
    return [int(x) for x in m[1].split()], int(m[2])


@dataclass(frozen=True)
class CountdownTraceOptions:
    """The countdown_trace task's options: its ``task.kwargs`` (each key a field, with the same default).

    Attributes:
        min_numbers, max_numbers: how many numbers a problem has (uniform in the range; at least 2). Four numbers
            give traces of hundreds to thousands of tokens: most four-number draws exceed ``max_trace_tokens`` and
            are dropped, which leaves only those solved early, so keep 3 unless the context grows.
        min_value, max_value: the range of the numbers (at least 1).
        min_target, max_target: the range of the target.
        max_trace_tokens: a drawn problem is kept only if its reference trace, EOS included, has at most this many
            tokens of the character tokenizer; also the task's ``max_new_tokens`` (what an evaluation needs).
        n_train: train problems per :meth:`CountdownTraceTask.problems` call; ``None`` = endless stream.
        n_eval: size of the eval split (distinct problems); 256 so that a run's default val and test parts (80 and
            100 of them, split by a hash of the prompt) fit for every ``eval.problem_seed`` tried (200 did not).
        eval_fraction: share of the problem space reserved for eval.
        eval_seed: seed of the eval draw; ``None`` = the seed passed to :meth:`CountdownTraceTask.problems`.
        split_key: key of the split hash; another key gives another (still disjoint) partition.
        exclude_eval_seeds: eval draws (their ``n_eval`` problems each, the order of the numbers aside) that this
            task's eval draw leaves out: the eval split holds only a few thousand problems, so two draws of 256
            share 5-13 % of them, and a trial's test problems must be ones no earlier trial (nor the base's
            pretraining score, draw 0) saw. Empty: every draw as before.
        chain_exclusions: take each draw in ``exclude_eval_seeds`` as a task excluding the draws listed before it
            drew it (a sequence of trials, each of which left out all earlier ones), instead of as a plain draw. A
            draw that excluded others holds problems beyond its plain draw's, which a later trial excluding only the
            plain draw may meet: the countdown calibration drew 6000 excluding 0, so the transfer trial lists
            ``[0, 6000]`` with this on. Off: every draw excluded as a plain draw, as before.
        exclude_n_eval: the size of each draw in ``exclude_eval_seeds`` (the ``n_eval`` it was drawn with); None:
            this task's own ``n_eval``, as before. A larger draw must not leave out more than the earlier trials
            saw: the eval split's short traces are few, so over-excluding them makes the draw harder (a fresh
            draw of 1024 excluding draws 0 and 6000 at 1024 each had a mean trace of 110 characters, not 75).
    """

    min_numbers: int = 3
    max_numbers: int = 3
    min_value: int = 1
    max_value: int = 30
    min_target: int = 10
    max_target: int = 99
    max_trace_tokens: int = 240
    n_train: int | None = None
    n_eval: int = 256
    eval_fraction: float = 0.1
    eval_seed: int | None = 0
    split_key: str = "satrl-countdown-trace-v1"
    exclude_eval_seeds: tuple[int, ...] = ()
    chain_exclusions: bool = False
    exclude_n_eval: int | None = None


class CountdownTraceTask:
    """Countdown problems whose reference completions are the solver's search traces; see the module docstring.

    Args:
        options: the task's settings (:class:`CountdownTraceOptions`, what ``task.kwargs`` build); checked here,
            each bad value refused in one line.
    """

    def __init__(self, options: CountdownTraceOptions = CountdownTraceOptions()) -> None:
        o = options
        min_numbers, max_numbers, min_value, max_value = o.min_numbers, o.max_numbers, o.min_value, o.max_value
        min_target, max_target, max_trace_tokens = o.min_target, o.max_target, o.max_trace_tokens
        n_train, n_eval, eval_fraction, eval_seed = o.n_train, o.n_eval, o.eval_fraction, o.eval_seed
        if not 2 <= min_numbers <= max_numbers:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
        if not 1 <= min_value <= max_value:
            raise ValueError(f"need 1 <= min_value <= max_value, got {min_value}, {max_value}")
        if not 1 <= min_target <= max_target:
            raise ValueError(f"need 1 <= min_target <= max_target, got {min_target}, {max_target}")
        if max_trace_tokens < 2 or n_eval < 1 or not 0 < eval_fraction < 1:
            raise ValueError(f"need max_trace_tokens >= 2, n_eval >= 1, 0 < eval_fraction < 1; got "
                             f"{max_trace_tokens}, {n_eval}, {eval_fraction}")  # fmt: skip
        if o.exclude_n_eval is not None and o.exclude_n_eval < 1:
            raise ValueError(f"exclude_n_eval must be >= 1 or None (this task's n_eval), got {o.exclude_n_eval}")
        if n_train is not None and n_train < 0:
            raise ValueError(f"n_train must be >= 0 or None (endless), got {n_train}")
        self.numbers = (min_numbers, max_numbers)
        self.values = (min_value, max_value)
        self.targets = (min_target, max_target)
        self.max_trace_tokens = max_trace_tokens
        self.max_new_tokens = max_trace_tokens  # the response cap an evaluation of this task needs
        self.n_train, self.n_eval = n_train, n_eval
        self.eval_fraction, self.eval_seed = eval_fraction, eval_seed
        self.split_key = o.split_key
        self.exclude_eval_seeds = tuple(int(s) for s in o.exclude_eval_seeds)
        self.options = options
        self.name = (f"countdown_trace(numbers={min_numbers}-{max_numbers},values={min_value}-{max_value},"
                     f"targets={min_target}-{max_target})")  # fmt: skip
        # draws rejected, by reason: the diagnostics `python -m satrl.tasks.countdown_trace` prints
        self.n_rejected = {"target_range": 0, "unsolved": 0, "too_long": 0}
        self.splits = Splits(eval_seed, self._eval_problems, self._train_stream)

    # ----------------------------------------------------------------------------- split membership
    def split_of(self, numbers: list[int] | tuple[int, ...], target: int) -> str:
        """``"eval"`` or ``"train"``: the one split that problem belongs to (the order of the numbers aside)."""
        return hashed_split(f"{','.join(map(str, sorted(numbers)))}>{target}", self.split_key, self.eval_fraction)

    # ----------------------------------------------------------------------------- problems
    def _draw(self, rng: random.Random) -> tuple[list[int], int] | None:
        """One draw as reasoning-gym's countdown draws (module docstring); None if its value is out of range."""
        numbers = [rng.randint(*self.values) for _ in range(rng.randint(*self.numbers))]
        value = numbers[0]
        for x in numbers[1:]:
            op = rng.choice("+-*/")
            if op == "/" and value % x:
                op = "-"
            value = value + x if op == "+" else value - x if op == "-" else value * x if op == "*" else value // x
        rng.shuffle(numbers)
        if not self.targets[0] <= value <= self.targets[1]:
            self.n_rejected["target_range"] += 1
            return None
        return numbers, value

    def _next(self, rng: random.Random, split: str) -> tuple[list[int], int, str]:
        """The next kept draw of ``split``: ``(numbers, target, trace text)``."""
        for _ in range(100_000):
            drawn = self._draw(rng)
            if drawn is None or self.split_of(*drawn) != split:
                continue
            trace = solve(*drawn)
            if not trace.solved:
                self.n_rejected["unsolved"] += 1
            elif len(trace.text) + 1 > self.max_trace_tokens:  # one token per character, + EOS
                self.n_rejected["too_long"] += 1
            else:
                return drawn[0], drawn[1], trace.text
        raise ValueError(f"{self.name}: 100000 draws gave no {split} problem; widen the ranges or max_trace_tokens")

    def make_problem(self, pid: str, numbers: list[int], target: int, trace: str) -> Problem:
        return Problem(id=pid, prompt=prompt_of(numbers, target), answer=trace)

    def problems(self, split: str, seed: int = 0) -> Iterator[Problem]:
        """Problems of ``split`` (``train`` or ``eval``) for ``seed``; see the module docstring."""
        return self.splits.problems(split, seed)

    def reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 iff the text after the last ``answer:`` uses every number once and equals the target exactly."""
        numbers, target = parse_prompt(problem.prompt)
        return 1.0 if check_answer(final_answer(completion_text), numbers, target) else 0.0

    def _train_stream(self, seed: int) -> Iterator[Problem]:
        rng = random.Random(f"countdown-train-{seed}")
        return counted(self.n_train, lambda i: self.make_problem(f"train/{seed}/{i}", *self._next(rng, "train")))

    def _eval_problems(self, seed: int) -> list[Problem]:
        """The eval draw of ``seed``: ``n_eval`` problems with distinct keys, none of the excluded draws'."""
        rng = random.Random(f"countdown-eval-{seed}")
        left_out = excluded_keys(self.exclude_eval_seeds, seed, self._excluded_draw,
                                 lambda p: _key(*parse_prompt(p.prompt)))  # fmt: skip
        chosen = distinct(self.n_eval, lambda: self._next(rng, "eval"), lambda d: _key(d[0], d[1]), left_out)
        return [self.make_problem(f"eval/{i}", *drawn) for i, drawn in enumerate(chosen)]

    def _excluded_draw(self, seed: int) -> list[Problem]:
        """The eval draw ``seed`` that ``exclude_eval_seeds`` leaves out: the plain draw, or with ``chain_exclusions``
        the draw as a task excluding the seeds listed before it made it."""
        order = list(self.exclude_eval_seeds)
        earlier = tuple(order[: order.index(seed)]) if self.options.chain_exclusions and seed in order else ()
        n_eval = self.options.exclude_n_eval or self.options.n_eval  # the size it was drawn with
        plain = CountdownTraceTask(replace(self.options, exclude_eval_seeds=earlier, eval_seed=None, n_eval=n_eval))
        return list(plain.problems("eval", seed))


def _key(numbers: list[int] | tuple[int, ...], target: int) -> tuple[tuple[int, ...], int]:
    """A problem's identity: its numbers in any order, and its target."""
    return tuple(sorted(numbers)), target


# ------------------------------------------------------------------------------------------- lengths
def _quantiles(xs: list[int]) -> dict[str, float]:
    xs = sorted(xs)
    return {"mean": round(statistics.fmean(xs), 1), "median": xs[len(xs) // 2],
            "p95": xs[min(len(xs) - 1, int(0.95 * len(xs)))], "max": xs[-1]}  # fmt: skip


def length_stats(task: CountdownTraceTask, n: int = 2000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Token counts (character tokenizer) of ``n`` train problems: prompt (with BOS), trace (with EOS), both; and
    the response (answer + EOS) of the arithmetic task the shipped bases learn, for the ratio."""
    from itertools import islice

    from satrl.models.tokenizer import build_char_tokenizer
    from satrl.tasks.arithmetic import ArithmeticOptions, ArithmeticTask

    tok = build_char_tokenizer(model_max_length=CONTEXT)

    def response(text: str) -> int:  # the tokens a policy generates: the text, then EOS
        return len(tok(text, add_special_tokens=False)["input_ids"]) + 1

    probs = list(islice(task.problems("train", seed), n))
    prompt = [len(tok(p.prompt)["input_ids"]) for p in probs]
    trace = [response(p.answer) for p in probs]
    arith = [response(p.answer) for p in islice(ArithmeticTask(ArithmeticOptions(digits=3, ops="+")).problems("train", seed), n)]
    total = [a + b for a, b in zip(prompt, trace)]
    stats = {"prompt": _quantiles(prompt), "trace": _quantiles(trace), "total": _quantiles(total),
             "arithmetic_response": _quantiles(arith)}  # fmt: skip
    ratio = stats["trace"]["mean"] / stats["arithmetic_response"]["mean"]
    stats["ratio_of_means"] = {"trace/arithmetic": round(ratio, 1)}
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Token lengths of countdown_trace problems (docs/tasks.md).")
    parser.add_argument("--n", type=int, default=2000, help="train problems to measure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    task = CountdownTraceTask()
    stats = length_stats(task, args.n, args.seed)
    print(f"{task.name}, {args.n} train problems, tokens of the character tokenizer:")
    for name, row in stats.items():
        print(f"  {name:20s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    print(f"  rejected draws: {task.n_rejected}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
