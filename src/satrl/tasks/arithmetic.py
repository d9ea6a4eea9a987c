"""The built-in verifiable task: integer arithmetic on zero-padded operands.

Prompt ``"123+456="`` (operands zero-padded to ``digits``), answer the plain integer ``"579"`` (a leading
``-`` for negative differences, no leading zeros). The reward is strict: the completion text (EOS already
removed by the engine) must equal the answer exactly, so ``" 579"``, ``"0579"`` or ``"579\\n"`` score 0.

Splits (the logic all tasks share: :mod:`satrl.tasks.splits`). Every expression ``(a, op, b)`` belongs to
exactly one split, decided by a keyed hash of the expression (blake2b, stable across processes and Python
versions): a fraction ``eval_fraction`` of the finite space is the eval partition, the rest is the train
partition. So no expression can ever appear in both splits, whatever the seeds.
- ``eval``: ``n_eval`` distinct problems from the eval partition. By default they are the same for every
  seed (``eval_seed=0``), so that runs with different seeds are scored on the same problems; pass
  ``eval_seed=None`` to draw them from the seed given to :meth:`problems` instead.
- ``train``: an endless stream (or ``n_train`` problems) drawn i.i.d. with replacement from the train
  partition, deterministic for the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from satrl.tasks.splits import SPLITS, Splits, counted, distinct, excluded_keys, hashed_split
from satrl.types import Problem

OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}
__all__ = ["OPS", "SPLITS", "ArithmeticOptions", "ArithmeticTask"]


def _triple(prompt: str, digits: int) -> tuple[int, str, int]:
    """``(a, op, b)`` of a prompt ``"123+456="`` (operands ``digits`` wide)."""
    return int(prompt[:digits]), prompt[digits], int(prompt[digits + 1 : 2 * digits + 1])

# Spaces up to this many expressions are enumerated exactly to build the eval split; larger ones are
# rejection-sampled (a duplicate-free draw is still guaranteed by a seen-set).
_ENUMERATE_LIMIT = 100_000


@dataclass(frozen=True)
class ArithmeticOptions:
    """The arithmetic task's options: its ``task.kwargs`` (each key a field, with the same default).

    Attributes:
        digits: operand width; operands are uniform in ``[0, 10**digits)``.
        ops: operators drawn uniformly, a subset of ``+ - *`` (a string such as ``"+-"`` or a sequence).
        n_train: number of train problems per :meth:`ArithmeticTask.problems` call; ``None`` = endless stream.
        n_eval: size of the eval split (distinct expressions).
        eval_fraction: share of the expression space reserved for eval.
        eval_seed: seed of the eval draw; ``None`` = use the seed passed to :meth:`ArithmeticTask.problems`.
        split_key: key of the split hash; changing it gives a different (still disjoint) partition.
        exclude_eval_seeds: eval draws (plain draws of ``exclude_n_eval`` problems each) that this task's eval draw
            leaves out, so that a trial's test problems are ones no earlier trial saw (draws of 200 from the 100,000
            eval expressions of 3-digit addition share a few problems with a draw of 4000). Empty: as before.
        exclude_n_eval: the size each excluded draw was drawn with; None: this task's ``n_eval``.
    """

    digits: int = 3
    ops: tuple[str, ...] | list[str] | str = ("+",)
    n_train: int | None = None
    n_eval: int = 200
    eval_fraction: float = 0.1
    eval_seed: int | None = 0
    split_key: str = "satrl-arith-v1"
    exclude_eval_seeds: tuple[int, ...] = ()
    exclude_n_eval: int | None = None


class ArithmeticTask:
    """Zero-padded ``a op b =`` problems with a strict exact-match reward.

    Args:
        options: the task's settings (:class:`ArithmeticOptions`, what ``task.kwargs`` build); checked here, each
            bad value refused in one line.
    """

    def __init__(self, options: ArithmeticOptions = ArithmeticOptions()) -> None:
        digits, ops, n_train, n_eval = options.digits, options.ops, options.n_train, options.n_eval
        eval_fraction = options.eval_fraction
        if isinstance(ops, str):
            ops = tuple(ops)  # "+-" -> ("+", "-")
        ops = tuple(ops)
        bad = [o for o in ops if o not in OPS]
        if not ops or bad:
            raise ValueError(f"ops must be a non-empty subset of {list(OPS)}, got {list(ops)}")
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops has duplicates: {list(ops)}")
        if not isinstance(digits, int) or digits < 1:
            raise ValueError(f"digits must be an int >= 1, got {digits!r}")
        if not 0 < eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        if n_eval < 1:
            raise ValueError(f"n_eval must be >= 1, got {n_eval}")
        if n_train is not None and n_train < 0:
            raise ValueError(f"n_train must be >= 0 or None (endless), got {n_train}")
        if options.exclude_n_eval is not None and options.exclude_n_eval < 1:
            raise ValueError(f"exclude_n_eval must be >= 1 or None (this task's n_eval), got {options.exclude_n_eval}")
        self.options = options
        self.digits = digits
        self.ops = ops
        self.n_train = n_train
        self.n_eval = n_eval
        self.eval_fraction = eval_fraction
        self.eval_seed = options.eval_seed
        self.split_key = options.split_key
        self.name = f"arithmetic(digits={digits},ops={''.join(ops)})"
        self.splits = Splits(self.eval_seed, self._eval_problems, self._train_stream)

    # ----------------------------------------------------------------------------- split membership
    @property
    def space_size(self) -> int:
        """Number of distinct expressions ``(a, op, b)``."""
        return len(self.ops) * 10 ** (2 * self.digits)

    def split_of(self, a: int, op: str, b: int) -> str:
        """``"eval"`` or ``"train"``: the one split that expression ``a op b`` belongs to."""
        return hashed_split(f"{a}{op}{b}", self.split_key, self.eval_fraction)

    # ----------------------------------------------------------------------------- problems
    def make_problem(self, pid: str, a: int, op: str, b: int) -> Problem:
        d = self.digits
        return Problem(id=pid, prompt=f"{a:0{d}d}{op}{b:0{d}d}=", answer=str(OPS[op](a, b)))

    def problems(self, split: str, seed: int = 0) -> Iterator[Problem]:
        """Problems of ``split`` (``train`` or ``eval``) for ``seed``; see the module docstring."""
        return self.splits.problems(split, seed)

    def reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 iff the completion equals the answer exactly (no whitespace or extra characters)."""
        return 1.0 if completion_text == problem.answer else 0.0

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        hi = 10**self.digits
        return rng.randrange(hi), self.ops[rng.randrange(len(self.ops))], rng.randrange(hi)

    def _next(self, rng: random.Random, split: str) -> tuple[int, str, int]:
        """The next draw that belongs to ``split``."""
        while True:
            t = self._draw(rng)
            if self.split_of(*t) == split:
                return t

    def _train_stream(self, seed: int) -> Iterator[Problem]:
        rng = random.Random(f"train-{seed}")
        return counted(self.n_train, lambda i: self.make_problem(f"train/{seed}/{i}", *self._next(rng, "train")))

    def _eval_problems(self, seed: int) -> list[Problem]:
        """The eval draw of ``seed``: a sample of the enumerated partition of a small space, else draws one by one."""
        rng = random.Random(f"eval-{seed}")
        left_out = self._excluded(seed)
        if self.space_size <= _ENUMERATE_LIMIT:
            triples = [t for t in self._eval_partition() if t not in left_out]
            if len(triples) < self.n_eval:
                raise ValueError(
                    f"the eval partition of {self.name} has only {len(triples)} expressions, fewer than "
                    f"n_eval={self.n_eval}; lower n_eval or raise eval_fraction (now {self.eval_fraction})"
                )
            chosen = rng.sample(triples, self.n_eval)
        else:
            chosen = distinct(self.n_eval, lambda: self._next(rng, "eval"), lambda t: t, left_out)
        return [self.make_problem(f"eval/{i}", *t) for i, t in enumerate(chosen)]

    def _excluded(self, seed: int) -> set[tuple[int, str, int]]:
        """The expressions of the plain eval draws ``exclude_eval_seeds`` (``exclude_n_eval`` each) but ``seed``'s own."""
        o = self.options
        if not o.exclude_eval_seeds:
            return set()
        plain = ArithmeticTask(replace(o, exclude_eval_seeds=(), n_eval=o.exclude_n_eval or self.n_eval, eval_seed=None))
        return excluded_keys(o.exclude_eval_seeds, seed, lambda other: plain.problems("eval", other),
                             lambda p: _triple(p.prompt, self.digits))  # fmt: skip

    def _eval_partition(self) -> list[tuple[int, str, int]]:
        """All eval expressions, in a fixed order (only for small spaces)."""
        hi = 10**self.digits
        return [
            (a, op, b)
            for op in self.ops
            for a in range(hi)
            for b in range(hi)
            if self.split_of(a, op, b) == "eval"
        ]
