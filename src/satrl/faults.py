"""Named fault points, for the chaos tests: ``SATRL_FAULT=NAME[:N]`` SIGKILLs this process the N-th time
(default: the first) it reaches ``point(NAME)``; ``SATRL_FAULT_SIGNAL=SIGSTOP`` sends that signal instead (a
hang: the process stops where it is). Unset (always, outside tests), ``point`` is one dict
lookup. Each process counts on its own, and spawned children inherit the variable: ``worker.rollout``
kills every engine child on its first rollout. ``SATRL_FAULT_SIGNAL=SIGKILL,SIGSTOP`` (several) gives the n-th
engine child the n-th signal, the last one repeating (see ``spawned``): one run suffers a death and a hang.
``none`` is no fault: ``SIGKILL,none`` kills the first engine child only, and its replacements run clean.

Points: ``checkpoint.weights`` / ``checkpoint.state`` (inside a checkpoint write, after the weights /
before the directory is renamed into place), ``metrics.write`` (half a line written), ``eval.start``,
``engine.load_weights`` (just before new weights go into the engine), ``worker.rollout``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_counts: dict[str, int] = {}
_before_kill: list[Callable[[], None]] = []


def on_kill(fn: Callable[[], None]) -> None:
    """Run ``fn`` in this process before any of its faults fires. The engine child registers "let the results
    already produced reach the parent": a fault at the N-th rollout models a crash during that rollout, and
    without this a SIGKILL right after a result was queued could beat the thread that sends it, so every
    restarted engine would lose its first batch too and a ``worker.rollout:2`` run could never progress."""
    _before_kill.append(fn)


def _target() -> tuple[str, int] | None:
    spec = os.environ.get("SATRL_FAULT")
    if not spec:
        return None
    name, _, n = spec.partition(":")
    return name, int(n or 1)


def _signals() -> list[str]:
    """``SATRL_FAULT_SIGNAL``'s signals in order (default: SIGKILL); this process uses the first."""
    return (os.environ.get("SATRL_FAULT_SIGNAL") or "SIGKILL").split(",")


def _signal() -> str:
    """This process's signal: the first of ``SATRL_FAULT_SIGNAL`` (default SIGKILL), or ``none``."""
    return _signals()[0]


def point(name: str, before: Callable[[], None] | None = None) -> None:
    """Die here (SIGKILL, no cleanup; or stop, see above) if ``SATRL_FAULT`` names this point and its count is reached;
    ``before`` runs first (e.g. to leave half a line behind)."""
    target = _target()
    if target is None or target[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == target[1] and _signal() != "none":
        for fn in _before_kill:
            fn()
        if before is not None:
            before()
        os.kill(os.getpid(), getattr(signal, _signal()))


def spawned() -> None:
    """Called by a parent right after it started an engine child (which inherited the environment as it was): with
    several signals in ``SATRL_FAULT_SIGNAL`` that child uses the first, so the next child gets the rest."""
    signals = _signals()
    if len(signals) > 1:
        os.environ["SATRL_FAULT_SIGNAL"] = ",".join(signals[1:])
