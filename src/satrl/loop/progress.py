"""Progress of a training run: step, reward, eval, lag, d_pi and SAT's gate rate.

On a terminal, a ``rich`` bar. Anywhere else (a log file, a pipe, CI), where a live bar degrades into
``━━━ 40… 0:… 0…``, plain lines every ~10 % of the steps (and at least once a minute), e.g.::

    runs/grpo/s0 step 40/200 (20%) 0:01:12 eta 0:04:48 reward 0.512 eval 0.430 lag 3.5 d_pi 0.0123 gate 0.010

Third-party progress bars (transformers' "Loading weights", huggingface_hub downloads) stay off for the run.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from satrl.config.run import RunConfig
from satrl.jsonl import read_jsonl
from satrl.loop.orchestrator import train
from satrl.models.loading import quiet_progress_bars
from satrl.training.dp import DataParallel

LOG_FRACTION = 10  # plain-line mode: a line every steps // LOG_FRACTION steps
BAR_WIDTH = (5, 40)  # the live bar's drawn bar, in columns: width // 8 within these
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
    (``eval_every`` as in ``eval.every``; the last step always evaluates). Until two steps have been timed the
    rate is ``prior_step_s`` (a resumed run's typical step so far, :func:`prior_step_s`), else unknown: ``eta ?``."""

    def __init__(self, name: str, total: int, stream: TextIO, cadence: Cadence = Cadence(),
                 clock=time.monotonic, eval_every: int = 0, prior_step_s: float | None = None) -> None:  # fmt: skip
        self.name, self.total, self.stream, self.clock = name, total, stream, clock
        self.prior_step_s = prior_step_s
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
        if self.n_step + self.n_eval < MIN_TIMED:  # a resumed run: its earlier sessions' pace until ours is known
            return None if self.prior_step_s is None else self.prior_step_s * (self.total - step)
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


def prior_step_s(metrics_path) -> float | None:
    """A run's typical step time so far: the median of the ``wall_s`` differences between consecutive steps of
    its ``metrics.jsonl`` (None with fewer than two): a resumed run's eta before it has timed steps of its own
    (its first plain line said ``eta ?``, issue 60). The median leaves out an eval's or a start-up's extra time."""
    rows = [r for r in read_jsonl(metrics_path) if isinstance(r.get("step"), int) and _number(r.get("wall_s"))]
    rows.sort(key=lambda r: r["step"])
    gaps = sorted(b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:]) if b["step"] == a["step"] + 1)
    gaps = [g for g in gaps if g > 0]
    return gaps[len(gaps) // 2] if len(gaps) >= 2 else None


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def fitted(width: int, name: str, total: int, info: str) -> tuple[str, int, str]:
    """``(name, bar width, info)`` of the live bar on a ``width``-column terminal, so that the step count, the
    elapsed time and the eta always show whole: room comes out of the metrics first, then the run's name (its
    end kept), the bar shrinking with the width (issue 60: at 80 columns the metrics took the width, and those
    three showed as ``…``)."""
    digits = len(str(total))
    fixed = (2 * digits + 1) + 8 + 8 + 5 + 1  # step/total, elapsed and eta (up to 99 h), the five gaps, a spare
    bar = max(BAR_WIDTH[0], min(BAR_WIDTH[1], width // 8))
    room = max(0, width - fixed - bar)
    keep = min(len(name), max(room - len(info), room // 2))
    if keep < len(name):
        name = "…" + name[len(name) - keep + 1 :] if keep > 1 else ""
    left = max(0, room - len(name) - 1)
    if len(info) > left:
        info = info[: left - 1] + "…" if left > 1 else ""
    return name, bar, info


def _with_bar(cfg: RunConfig, resume: bool, stream: TextIO, ctx: DataParallel | None) -> dict:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    drawn = BarColumn()
    columns = (
        TextColumn("{task.description}", style="bold", markup=False),  # a path is no markup
        drawn,
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}", markup=False),
    )
    with Progress(*columns, console=Console(file=stream), transient=False) as bar:
        name = str(cfg.run_dir())
        shown, drawn.bar_width, _ = fitted(bar.console.width, name, cfg.steps, "")
        task = bar.add_task(shown, total=cfg.steps, info="")
        last_eval: dict = {}

        def on_step(step: int, row: dict, eval_row: dict | None) -> None:
            if eval_row:
                last_eval.update(eval_row)
            shown, drawn.bar_width, info = fitted(bar.console.width, name, cfg.steps, step_info(row, last_eval))
            bar.update(task, completed=step, description=shown, info=info)

        return train(cfg, resume=resume, on_step=on_step, ctx=ctx)


def train_with_progress(cfg: RunConfig, resume: bool = False, progress: bool = True, stream: TextIO | None = None,
                        ctx: DataParallel | None = None) -> dict:  # fmt: skip
    """``train(cfg)`` reporting progress on ``stream`` (default stdout): a live bar if it is a terminal,
    plain periodic lines otherwise, nothing if ``progress`` is False. Returns the run's summary. ``ctx``: under
    data parallel, this process's place in the job (:func:`~satrl.loop.orchestrator.train`)."""
    stream = sys.stdout if stream is None else stream
    with quiet_progress_bars():
        if not progress:
            return train(cfg, resume=resume, ctx=ctx)
        if stream.isatty():
            return _with_bar(cfg, resume, stream, ctx)
        prior = prior_step_s(cfg.run_dir() / "metrics.jsonl") if resume else None
        log = LineLog(str(cfg.run_dir()), cfg.steps, stream, eval_every=cfg.eval.every, prior_step_s=prior)
        return train(cfg, resume=resume, on_step=log, ctx=ctx)
