"""The train/eval split logic the built-in tasks share, written once and composed into each task.

A task gives two functions of a seed: its eval draw (a list) and its train stream (an iterator). :class:`Splits`
answers the task protocol's ``problems(split, seed)`` from them:
- ``eval``: the eval draw of ``eval_seed`` (the same problems for every run seed), or of the run seed when
  ``eval_seed`` is None; each draw is made once and kept, so a task scores the same problems all run long.
- ``train``: the train stream of the run seed.

The helpers below are the pieces the arithmetic and countdown_trace draws have in common: a keyed-hash partition
(:func:`hashed_split`), a counted stream (:func:`counted`), a draw of distinct problems that leaves some out
(:func:`distinct`), and the keys of earlier eval draws to leave out (:func:`excluded_keys`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

from satrl.types import Problem

SPLITS = ("train", "eval")
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def hashed_split(key: str, split_key: str, eval_fraction: float) -> str:
    """``"eval"`` or ``"train"``: the one split the problem ``key`` belongs to, whatever the seeds.

    A keyed blake2b hash of ``key`` (stable across processes and Python versions), read as a number in ``[0, 1)``,
    is eval below ``eval_fraction``; another ``split_key`` gives another, still disjoint, partition.
    """
    h = hashlib.blake2b(key.encode(), digest_size=8, key=split_key.encode()).digest()
    return "eval" if int.from_bytes(h, "big") / 2.0**64 < eval_fraction else "train"


def counted(n: int | None, make: Callable[[int], T]) -> Iterator[T]:
    """``make(0), make(1), ...``: ``n`` items, or an endless stream when ``n`` is None."""
    i = 0
    while n is None or i < n:
        yield make(i)
        i += 1


def distinct(n: int, draw: Callable[[], T], key: Callable[[T], K], left_out: set[K]) -> list[T]:
    """The first ``n`` draws whose keys are new: not in ``left_out`` and not drawn before (``left_out`` grows)."""
    chosen: list[T] = []
    while len(chosen) < n:
        item = draw()
        k = key(item)
        if k not in left_out:
            left_out.add(k)
            chosen.append(item)
    return chosen


def excluded_keys(seeds: Iterable[int], seed: int, draw_of: Callable[[int], Iterable[Problem]],
                  key: Callable[[Problem], K]) -> set[K]:  # fmt: skip
    """The keys of the eval draws ``seeds`` (each as ``draw_of`` makes it) but ``seed``'s own: the problems an eval
    draw leaves out so that a trial's test problems are ones no earlier trial saw."""
    return {key(p) for other in seeds if other != seed for p in draw_of(other)}


class Splits:
    """A task's ``problems(split, seed)``: its eval draws, made once per seed and kept, and its train streams.

    Args:
        eval_seed: the seed of the eval draw; None: the seed given to :meth:`problems`.
        eval_draw: the eval problems of a seed.
        train_stream: the train problems of a seed.
    """

    def __init__(self, eval_seed: int | None, eval_draw: Callable[[int], list[Problem]],
                 train_stream: Callable[[int], Iterator[Problem]]) -> None:  # fmt: skip
        self.eval_seed = eval_seed
        self._eval_draw = eval_draw
        self._train_stream = train_stream
        self._eval: dict[int, list[Problem]] = {}

    def problems(self, split: str, seed: int = 0) -> Iterator[Problem]:
        """Problems of ``split`` (``train`` or ``eval``) for ``seed``; see the module docstring."""
        if split == "eval":
            return iter(self.eval(self.eval_seed_for(seed)))
        if split == "train":
            return self._train_stream(seed)
        raise ValueError(f"unknown split {split!r}; valid choices: {list(SPLITS)}")

    def eval_seed_for(self, seed: int) -> int:
        """The seed of the eval draw a run with ``seed`` is scored on."""
        return seed if self.eval_seed is None else self.eval_seed

    def eval(self, eval_seed: int) -> list[Problem]:
        """The eval draw of ``eval_seed`` (not the run seed), drawn on first use."""
        if eval_seed not in self._eval:
            self._eval[eval_seed] = self._eval_draw(eval_seed)
        return self._eval[eval_seed]
