"""A ``rich`` progress bar for a training run: step, reward, eval, lag, d_pi and SAT's gate rate."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from satrl.config import RunConfig
from satrl.pipeline.orchestrator import train


def _fmt(row: dict, key: str, spec: str = ".3f") -> str:
    v = row.get(key)
    return "-" if v is None else format(v, spec)


def train_with_progress(cfg: RunConfig, resume: bool = False, progress: bool = True) -> dict:
    if not progress:
        return train(cfg, resume=resume)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(str(cfg.run_dir()), total=cfg.steps, info="")
        last_eval: dict = {}

        def on_step(step: int, row: dict, eval_row: dict | None) -> None:
            if eval_row:
                last_eval.update(eval_row)
            info = (
                f"reward {_fmt(row, 'train/reward')} eval {_fmt(last_eval, 'avg_at_k')} "
                f"lag {_fmt(row, 'lag/mean', '.1f')} d_pi {_fmt(row, 'obj/d_pi', '.4f')} "
                f"gate {_fmt(row, 'obj/gate_rate')}"
            )
            bar.update(task, completed=step, info=info)

        return train(cfg, resume=resume, on_step=on_step)
