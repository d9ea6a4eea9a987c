"""Verifiable tasks: the built-in arithmetic task, local JSONL/parquet math sets, reasoning-gym tasks.

:func:`make_task` is the one place where a task name chooses behaviour. The jsonl and reasoning-gym
modules are imported lazily, so ``import satrl.tasks`` stays light.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from satrl.tasks.arithmetic import ArithmeticTask
from satrl.types import Problem, Task


class TaskError(ValueError):
    """A bad task name, task argument or dataset: one line naming the task, or the file and line."""


def _jsonl_math(**kwargs: Any) -> Task:
    from satrl.tasks.jsonl_math import JsonlMathTask

    return JsonlMathTask(**kwargs)


def _countdown(**kwargs: Any) -> Task:
    from satrl.tasks.gym import ReasoningGymTask

    return ReasoningGymTask("countdown", **kwargs)


TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "jsonl_math": _jsonl_math,
    "countdown": _countdown,
}
GYM_PREFIX = "gym:"


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name: ``arithmetic``, ``jsonl_math`` (``path=...``), ``countdown`` or
    ``gym:<reasoning_gym dataset name>``; ``kwargs`` go to the task's constructor."""
    if name.startswith(GYM_PREFIX) and len(name) > len(GYM_PREFIX):
        from satrl.tasks.gym import ReasoningGymTask

        factory: Callable[..., Task] = functools.partial(ReasoningGymTask, name[len(GYM_PREFIX) :])
    elif name in TASKS:
        factory = TASKS[name]
    else:
        raise TaskError(
            f"unknown task {name!r}; valid choices: {sorted(TASKS)} or '{GYM_PREFIX}<reasoning_gym dataset>'"
        )
    try:
        return factory(**kwargs)
    except TaskError:
        raise
    except TypeError as e:  # a misspelt or missing constructor argument: say which task and what
        raise TaskError(f"bad arguments for task {name!r}: {e}") from e
    except (ValueError, OSError, ImportError) as e:  # bad data, a bad path, a missing reader: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TaskError(f"task {name!r}: {first}") from e


__all__ = ["ArithmeticTask", "Problem", "Task", "TaskError", "TASKS", "make_task"]
