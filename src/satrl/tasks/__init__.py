"""Verifiable tasks: the built-in arithmetic task, countdown with search traces, local JSONL/parquet math sets,
reasoning-gym tasks.

:func:`make_task` is the one place where a task name chooses behaviour; the names are the :data:`TASKS`
registry (a new task is ``TASKS.register("name", factory)``, or the decorator on a factory), plus
``gym:<dataset>`` for any reasoning-gym dataset. The jsonl, countdown_trace and reasoning-gym modules are imported
lazily, so ``import satrl.tasks`` stays light.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from satrl.registry import Registry, UnknownChoice
from satrl.tasks.arithmetic import ArithmeticOptions, ArithmeticTask
from satrl.types import Problem, Task


class TaskError(ValueError):
    """A bad task name, task argument or dataset: one line naming the task, or the file and line."""


def check_template(template: str, field: str) -> None:
    """``ValueError`` (one line) unless ``template`` is a ``str.format`` template whose only field is ``{field}``
    (a literal brace is written ``{{`` or ``}}``): checked once here, not as a KeyError at the first row."""
    if not isinstance(template, str) or "{" + field + "}" not in template:
        raise ValueError(f"prompt_template must contain '{{{field}}}', got {template!r}")
    try:
        template.format(**{field: ""})
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        what = f"unknown field {{{e.args[0]}}}" if isinstance(e, KeyError) and e.args else str(e)
        raise ValueError(f"prompt_template {template!r}: {what}; the only field is {{{field}}} (write a literal "
                         "brace as {{ or }})") from None  # fmt: skip


GYM_PREFIX = "gym:"


def _gym(name: str) -> Callable[..., Task] | None:
    """``gym:<dataset>``: any reasoning-gym dataset (checked when the task is built)."""
    if not (name.startswith(GYM_PREFIX) and len(name) > len(GYM_PREFIX)):
        return None

    def build(**kwargs: Any) -> Task:
        from satrl.tasks.gym import ReasoningGymTask

        return ReasoningGymTask.from_kwargs(name[len(GYM_PREFIX) :], **kwargs)

    return build


TASKS: Registry[Callable[..., Task]] = Registry("task", fallback=_gym, hint=f" or '{GYM_PREFIX}<reasoning_gym dataset>'")


@TASKS.register("arithmetic")
def _arithmetic(**kwargs: Any) -> Task:
    return ArithmeticTask(ArithmeticOptions(**kwargs))


# Its keys, as its factory's signature: `satrl pretrain` passes digits and ops only to a task whose factory names them.
_arithmetic.__signature__ = inspect.signature(ArithmeticOptions)


@TASKS.register("jsonl_math")
def _jsonl_math(**kwargs: Any) -> Task:
    from satrl.tasks.jsonl_math import JsonlMathOptions, JsonlMathTask

    return JsonlMathTask(JsonlMathOptions(**kwargs))


def _jsonl_math_splits(kwargs: dict[str, Any]) -> str | None:
    # an eval_fraction given as 0 or 1; the default (1.0, every row eval: the use of satrl eval) is met when the
    # run asks for train problems, as a TaskError (one line)
    frac = kwargs.get("eval_fraction")
    if isinstance(frac, bool) or not isinstance(frac, int | float) or 0 < frac < 1:
        return None  # a wrong type is the task's own error, when it is built
    split = "eval" if frac >= 1 else "train"
    return (f"task.kwargs.eval_fraction={frac}: jsonl_math puts every row in the {split} split, and training needs "
            "both; set task.kwargs.eval_fraction between 0 and 1 (e.g. 0.2)"
            + (" (1, every row eval, is for satrl eval)" if frac >= 1 else ""))  # fmt: skip


_jsonl_math.split_problem = _jsonl_math_splits


@TASKS.register("countdown_trace")
def _countdown_trace(**kwargs: Any) -> Task:
    """Countdown whose reference completions are depth-first search traces: long responses, exact reward
    (docs/tasks.md). Its task.kwargs: min_numbers/max_numbers (3), min_value/max_value (1-30), min_target/max_target
    (10-99), max_trace_tokens (240, also its max_new_tokens), n_train (endless), n_eval (256), eval_fraction (0.1),
    eval_seed (0), split_key, exclude_eval_seeds (none), chain_exclusions (off);
    :class:`satrl.tasks.countdown_trace.CountdownTraceOptions` says what each does."""
    # imported here, so that `python -m satrl.tasks.countdown_trace` (its length statistics) runs it only once
    from satrl.tasks.countdown_trace import CountdownTraceOptions, CountdownTraceTask

    return CountdownTraceTask(CountdownTraceOptions(**kwargs))


@TASKS.register("countdown")
def _countdown(**kwargs: Any) -> Task:
    from satrl.tasks.gym import ReasoningGymTask

    return ReasoningGymTask.from_kwargs("countdown", **kwargs)


def split_problem(name: str, kwargs: dict[str, Any]) -> str | None:
    """Why task ``name`` with ``kwargs`` would have no train or no eval problems, where its arguments alone say so
    (a factory's ``split_problem(kwargs)``: jsonl_math's ``eval_fraction`` given as 0 or 1); a run needs both, and
    the config refuses it before anything starts. None: nothing known against it."""
    factory = TASKS.get(name, None)
    check = getattr(factory, "split_problem", None)
    return check(kwargs) if check is not None else None


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name: ``arithmetic``, ``countdown_trace``, ``jsonl_math`` (``path=...``), ``countdown`` or
    ``gym:<reasoning_gym dataset name>``; ``kwargs`` go to the task's constructor."""
    try:
        factory = TASKS.get(name)
    except UnknownChoice as e:
        raise TaskError(str(e)) from None
    try:
        return factory(**kwargs)
    except TaskError:
        raise
    except TypeError as e:  # a misspelt or missing constructor argument: say which task and what
        raise TaskError(f"bad arguments for task {name!r}: {e}") from e
    except (ValueError, OSError, ImportError) as e:  # bad data, a bad path, a missing reader: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TaskError(f"task {name!r}: {first}") from e


__all__ = ["ArithmeticOptions", "ArithmeticTask", "Problem", "Task", "TaskError", "TASKS", "make_task", "split_problem"]
