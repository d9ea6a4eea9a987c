"""Progress of a training run: step, reward, eval, lag, d_pi and SAT's gate rate.

On a terminal, a ``rich`` bar. Anywhere else (a log file, a pipe, CI), where a live bar degrades into
``━━━ 40… 0:… 0…``, plain lines every ~10 % of the steps (and at least once a minute), e.g.::

    runs/grpo/s0 step 40/200 (20%) 0:01:12 eta 0:04:48 reward 0.512 eval 0.430 lag 3.5 d_pi 0.0123 gate 0.010

Third-party progress bars (transformers' "Loading weights", huggingface_hub downloads) stay off for the run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

from satrl.models.loading import quiet_progress_bars
from satrl.pipeline.orchestrator import train
from satrl.pipeline.run_config import RunConfig

LOG_FRACTION = 10  # plain-line mode: a line every steps // LOG_FRACTION steps
LOG_SECONDS = 60.0  # ... and after at most this many seconds without one
MIN_TIMED = 2  # steps timed (after the first, warm-up interval) before an eta is printed


def _fmt(row: dict, key: str, spec: str = ".3f") -> str:
    v = row.get(key)
    return "-" if v is None else format(v, spec)


def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def step_info(row: dict, last_eval: dict) -> str:
    """``reward .. eval .. lag .. d_pi .. gate ..`` of one step's metrics row and the latest eval (its test
    score)."""
    return (
        f"reward {_fmt(row, 'train/reward')} eval {_fmt(last_eval, 'test_avg_at_k')} "
        f"lag {_fmt(row, 'lag/mean', '.1f')} d_pi {_fmt(row, 'mismatch/d_pi', '.4f')} "
        f"gate {_fmt(row, 'obj/gate_rate')}"
    )


@dataclass(frozen=True)
class Cadence:
    """When :class:`LineLog` prints a line (besides the last step).

    Attributes:
        every: every this many steps; None: every ``total // LOG_FRACTION`` steps (at least 1).
        seconds: after this many seconds without a line.
    """

    every: int | None = None
    seconds: float = LOG_SECONDS


class LineLog:
    """``on_step`` callback printing one plain line every ``cadence.every`` steps, after ``cadence.seconds``
    without a line, and at the last step (:class:`Cadence`). ``clock`` is injectable for tests.

    The eta is measured from this process's second step on, so start-up (imports, the model, the step-0 eval)
    and the first step after it (the pipeline filling: the engine's first batches, first-call allocations; the
    issue-47 probe saw the step-2 eta 3x too long) do not inflate it: the mean time of a step without an eval
    times the steps left, plus, once an eval has been seen, its extra time times the evals still due
    (``eval_every`` as in ``eval.every``; the last step always evaluates). Until two steps have been timed there
    is no rate: ``eta ?``."""

    def __init__(self, name: str, total: int, stream: TextIO, cadence: Cadence = Cadence(),
                 clock=time.monotonic, eval_every: int = 0) -> None:  # fmt: skip
        self.name, self.total, self.stream, self.clock = name, total, stream, clock
        self.every = cadence.every or max(1, total // LOG_FRACTION)
        self.seconds, self.eval_every = cadence.seconds, eval_every
        self.t0 = self.last_t = clock()
        self.prev: float | None = None  # the previous step's time (None before the first step)
        self.warm = False  # the first interval (the pipeline filling) is not a step's time
        self.step_s = self.eval_s = 0.0  # summed intervals of steps without / with an eval
        self.n_step = self.n_eval = 0
        self.last_eval: dict = {}

    def evals_left(self, step: int) -> int:
        """Evals still due after ``step``: every ``eval_every`` steps, and at the last step."""
        if step >= self.total:
            return 0
        k = self.eval_every
        periodic = self.total // k - step // k if k > 0 else 0
        return periodic + (0 if k > 0 and self.total % k == 0 else 1)

    def eta(self, step: int) -> float | None:
        if self.n_step + self.n_eval < MIN_TIMED:
            return None
        per_step = self.step_s / self.n_step if self.n_step else self.eval_s / self.n_eval
        per_eval = max(0.0, self.eval_s / self.n_eval - per_step) if self.n_eval else 0.0
        return per_step * (self.total - step) + per_eval * self.evals_left(step)

    def __call__(self, step: int, row: dict, eval_row: dict | None) -> None:
        if eval_row:
            self.last_eval.update(eval_row)
        now = self.clock()
        if self.prev is not None and not self.warm:  # the first interval warms the pipeline up: not counted
            self.warm = True
        elif self.prev is not None:  # a resumed run starts past 0: its rate counts this process's steps only
            if eval_row:
                self.eval_s, self.n_eval = self.eval_s + now - self.prev, self.n_eval + 1
            else:
                self.step_s, self.n_step = self.step_s + now - self.prev, self.n_step + 1
        self.prev = now
        if not (step % self.every == 0 or step >= self.total or now - self.last_t >= self.seconds):
            return
        self.last_t = now
        eta = self.eta(step)
        print(
            f"{self.name} step {step}/{self.total} ({step / max(self.total, 1):.0%}) {_hms(now - self.t0)} "
            f"eta {'?' if eta is None else _hms(eta)} {step_info(row, self.last_eval)}",
            file=self.stream,
            flush=True,
        )


def _with_bar(cfg: RunConfig, resume: bool, stream: TextIO) -> dict:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=Console(file=stream), transient=False) as bar:
        task = bar.add_task(str(cfg.run_dir()), total=cfg.steps, info="")
        last_eval: dict = {}

        def on_step(step: int, row: dict, eval_row: dict | None) -> None:
            if eval_row:
                last_eval.update(eval_row)
            bar.update(task, completed=step, info=step_info(row, last_eval))

        return train(cfg, resume=resume, on_step=on_step)


def train_with_progress(
    cfg: RunConfig, resume: bool = False, progress: bool = True, stream: TextIO | None = None
) -> dict:
    """``train(cfg)`` reporting progress on ``stream`` (default stdout): a live bar if it is a terminal,
    plain periodic lines otherwise, nothing if ``progress`` is False. Returns the run's summary."""
    stream = sys.stdout if stream is None else stream
    with quiet_progress_bars():
        if not progress:
            return train(cfg, resume=resume)
        if stream.isatty():
            return _with_bar(cfg, resume, stream)
        log = LineLog(str(cfg.run_dir()), cfg.steps, stream, eval_every=cfg.eval.every)
        return train(cfg, resume=resume, on_step=log)
