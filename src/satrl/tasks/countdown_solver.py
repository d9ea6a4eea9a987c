"""Countdown's depth-first solver, which writes its search as a trace, and the exact scorer of a final answer.

The rules are reasoning-gym's countdown (``reasoning_gym.games.countdown``): reach the target with ``+ - * /``
and parentheses, using **every** given number exactly once (its scorer compares the sorted literals of the
answer with the sorted numbers), division being real division.

The search. A state is a list of numbers, each with the expression that made it. Pairs ``(i, j)``, ``i < j``, are
taken in list order, and each pair is combined larger-first ``a >= b`` (ties: list order) in the fixed order
``a+b, a-b, a*b, a/b``, the last only when ``b > 0`` divides ``a``: every intermediate value is a natural number,
as in the game show (a search over rationals would add branches a tiny model cannot use). The result goes first in
the child state, then the untouched numbers in their order. With two numbers left the four results are the leaves.

The trace (every character is in the character tokenizer: digits, ``+-*/=()``, space, ``,.:``, letters):

- an inner node is ``a op b=r:`` followed by its subtree;
- a node with two numbers left lists its leaf values, ``26+14=40`` giving ``40``; the leaf that equals the target
  is spelled out and marked, ``182/2=91 ok``, and the search stops there;
- items are joined by ``, ``; the trace ends ``. answer: EXPR`` (``. answer: none`` when nothing reaches the target).

Example, numbers 13 2 14 and target 91::

    13+2=15: 29 1 210, 13-2=11: 25 3 154, 13*2=26: 40 12 364, 14+13=27: 29 25 54, 14-13=1: 3 1 2 2,
    14*13=182: 184 180 364 182/2=91 ok. answer: (14*13)/2

The scorer (:func:`check_answer`) is exact: a recursive-descent parser over integers, ``+ - * /`` and parentheses
with :class:`fractions.Fraction` arithmetic. On such expressions it agrees with reasoning-gym's ``score_answer``
(== 1.0) (tests/tasks/test_countdown_trace.py); it is stricter on what is not a countdown expression but sympy
evaluates (``2**3``, a unary minus, ``03``), and it never calls ``eval``, which sympy's ``parse_expr`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

OPS = ("+", "-", "*", "/")
ANSWER = ". answer: "  # what precedes the final expression in a trace
NONE = "none"  # the final "expression" of a search that found nothing (scores 0)


@dataclass(frozen=True)
class Trace:
    """A solver's output: the full ``text`` (what the policy learns to write) and the final ``expression``
    (``None`` when no expression reaches the target)."""

    text: str
    expression: str | None

    @property
    def solved(self) -> bool:
        return self.expression is not None


def combine(a: int, b: int) -> Iterator[tuple[str, int]]:
    """The results of ``a op b`` for ``a >= b >= 0``, in the search's order (``/`` only when exact)."""
    yield "+", a + b
    yield "-", a - b
    yield "*", a * b
    if b > 0 and a % b == 0:
        yield "/", a // b


def _ordered(x: tuple[int, str], y: tuple[int, str]) -> tuple[tuple[int, str], tuple[int, str]]:
    return (y, x) if y[0] > x[0] else (x, y)  # larger first; a tie keeps list order


def _leaf(items: list[tuple[int, str]], target: int, out: list[str]) -> str | None:
    (a, ea), (b, eb) = _ordered(*items)
    values: list[str] = []
    for op, r in combine(a, b):
        if r == target:
            out[-1] += " " + " ".join([*values, f"{a}{op}{b}={r} ok"])
            return f"{ea}{op}{eb}"
        values.append(str(r))
    out[-1] += " " + " ".join(values)
    return None


def _search(items: list[tuple[int, str]], target: int, out: list[str]) -> str | None:
    """Depth-first over ``items`` (value, expression); appends trace items to ``out``; the answer or None."""
    if len(items) == 2:
        return _leaf(items, target, out)
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            (a, ea), (b, eb) = _ordered(items[i], items[j])
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for op, r in combine(a, b):
                out.append(f"{a}{op}{b}={r}:")
                found = _search([(r, f"({ea}{op}{eb})"), *rest], target, out)
                if found is not None:
                    return found
    return None


def solve(numbers: list[int] | tuple[int, ...], target: int) -> Trace:
    """The depth-first trace for ``numbers`` (in the order given: the order is part of the problem) and ``target``."""
    if len(numbers) < 2 or min(numbers) < 1:
        raise ValueError(f"countdown needs at least 2 positive numbers, got {list(numbers)}")
    out: list[str] = [""]  # a 2-number problem is a single leaf, written into this first item
    expr = _search([(n, str(n)) for n in numbers], target, out)
    body = ", ".join(x.strip() for x in out if x.strip())
    return Trace(f"{body}{ANSWER}{expr if expr is not None else NONE}", expr)


# --------------------------------------------------------------------------------------------- the exact scorer
class _Parser:
    """``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/') factor)*``, ``factor := INT | '(' expr ')'``;
    spaces between tokens; an integer has no leading zero. Collects the integer literals it reads."""

    def __init__(self, text: str) -> None:
        self.s, self.i, self.literals = text, 0, []

    def _peek(self) -> str:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        return self.s[self.i] if self.i < len(self.s) else ""

    def parse(self) -> Fraction:
        value = self._expr()
        if self._peek():
            raise ValueError(f"unexpected {self.s[self.i]!r} at {self.i}")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            op = self.s[self.i]
            self.i += 1
            rhs = self._term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            op = self.s[self.i]
            self.i += 1
            rhs = self._factor()
            if op == "/" and rhs == 0:
                raise ValueError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def _factor(self) -> Fraction:
        ch = self._peek()
        if ch == "(":
            self.i += 1
            value = self._expr()
            if self._peek() != ")":
                raise ValueError(f"missing ')' at {self.i}")
            self.i += 1
            return value
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit() and self.s[self.i].isascii():
            self.i += 1
        digits = self.s[start : self.i]
        if not digits or (len(digits) > 1 and digits[0] == "0"):
            raise ValueError(f"expected a number at {start}")
        self.literals.append(int(digits))
        return Fraction(int(digits))


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """The exact value of ``expression`` and its integer literals in order, or None if it is not one."""
    parser = _Parser(expression)
    try:
        return parser.parse(), parser.literals
    except ValueError:
        return None


def check_answer(expression: str | None, numbers: list[int] | tuple[int, ...], target: int) -> bool:
    """True iff ``expression`` parses, uses exactly ``numbers`` (as a multiset) and equals ``target`` exactly."""
    parsed = evaluate(expression) if expression is not None else None
    if parsed is None:
        return False
    value, literals = parsed
    return sorted(literals) == sorted(numbers) and value == target


def final_answer(completion: str) -> str | None:
    """The text after the last ``answer:`` of a completion (spaces stripped), or None if there is none."""
    head, sep, tail = completion.rpartition("answer:")
    return tail.strip() if sep else None
