"""``satrl pretrain``: supervised next-token training of a tiny base policy on a task's train split.

The sequence of one problem is ``<bos> prompt answer <eos>``; the loss is the mean cross-entropy over the
answer and EOS tokens only (prompt tokens are labelled -100). AdamW, lr 1e-3, betas (0.9, 0.98), weight
decay 0, a linear warm-up over the first ``warmup`` steps and then a constant rate, gradient-norm clip 1.

The schedule never looks at the total number of steps, on purpose: a run with ``--steps N`` is exactly
the first N steps of any longer run with the same seed. Calibration is therefore "train long, score
every few hundred steps, pick the N where avg@8 lands in the target band, rerun with ``--steps N``".
Everything is deterministic for ``seed`` *and* ``threads`` (CPU matmul reductions depend on the thread
count), so both are recorded in ``pretrain.json`` together with the exact command.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from satrl.models.sampler import score
from satrl.models.tiny import COMMON, build_tiny_model, count_params
from satrl.models.tokenizer import build_char_tokenizer
from satrl.registry import Registry

# What `--model NAME` means: the recipe of each policy (CLI flags override kind, task, digits and ops; model_cfg
# overrides the tiny model's config). The countdown bases need 256 positions (prompt <= 16 + trace <= 240 tokens,
# satrl.tasks.countdown_trace.CONTEXT); the arithmetic ones keep the 64 they shipped with.
_LONG = {"max_position_embeddings": 256}
RECIPES: Registry[dict[str, Any]] = Registry("pretrain recipe", {
    "tiny-arith": {"kind": "dense", "task": "arithmetic", "digits": 3, "ops": "+"},
    "tiny-arith-moe": {"kind": "moe", "task": "arithmetic", "digits": 3, "ops": "+"},
    "tiny-countdown": {"kind": "dense", "task": "countdown_trace", "model_cfg": _LONG},
    "tiny-countdown-moe": {"kind": "moe", "task": "countdown_trace", "model_cfg": _LONG},
})


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], answers: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` [B, L] and ``labels`` [B, L] (-100 except on the
    answer and EOS tokens), ready for ``model(**batch).loss``."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows, labels = [], []
    for p, a in zip(prompts, answers):
        p_ids = tokenizer(p)["input_ids"]
        a_ids = tokenizer(a, add_special_tokens=False)["input_ids"] + [eos]
        rows.append(p_ids + a_ids)
        labels.append([-100] * len(p_ids) + a_ids)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, y) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(y)] = torch.tensor(y)
        attn[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": attn, "labels": lab}


def _batches(task: Any, seed: int, batch_size: int) -> Iterator[tuple[list[str], list[str]]]:
    stream = task.problems("train", seed)
    while True:
        chunk = [next(stream) for _ in range(batch_size)]
        yield [p.prompt for p in chunk], [p.answer for p in chunk]


def _make_task(name: str, digits: int, ops: str) -> Any:
    """The task ``name``, given ``digits`` and ``ops`` where its factory declares them (arithmetic's do)."""
    # Imported lazily: pretraining lives in training/, which may use tasks (docs/design.md, "Layers").
    from satrl.tasks import TASKS, make_task

    declared = inspect.signature(TASKS.get(name)).parameters
    return make_task(name, **{k: v for k, v in {"digits": digits, "ops": ops}.items() if k in declared})


@dataclass(frozen=True)
class PretrainSettings:
    """What ``satrl pretrain`` trains, and how (the CLI's flags; ``RECIPES`` fills the first four per policy).

    Attributes:
        kind: ``dense`` or ``moe`` (:func:`satrl.models.tiny.build_tiny_model`).
        task, digits, ops: the task whose train split is learned (digits and ops: arithmetic's).
        steps, batch_size, lr, warmup, seed, threads: the run (results depend on ``threads``: CPU reductions).
        eval_every, eval_problems, eval_k: score avg@``eval_k`` on ``eval_problems`` eval problems every
            ``eval_every`` steps (0: never); its sampling has its own generator, so training is unchanged.
        stop_avg: stop at the first such score >= this.
        final_eval_problems: problems of the final score (0: none).
        model_cfg: overrides of the tiny model's config (tests shrink it).
    """

    kind: str = "dense"
    task: str = "arithmetic"
    digits: int = 3
    ops: str = "+"
    steps: int = 1000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    threads: int = 2
    eval_every: int = 0
    eval_problems: int = 100
    eval_k: int = 8
    stop_avg: float | None = None
    final_eval_problems: int = 200
    model_cfg: dict[str, Any] = field(default_factory=dict)

    def record_args(self) -> dict[str, Any]:
        """The ``args`` of ``pretrain.json`` (the shipped policies' files have exactly these keys)."""
        keys = ("kind", "task", "digits", "ops", "steps", "batch_size", "lr", "seed", "warmup", "threads")
        return {**{k: getattr(self, k) for k in keys}, "betas": [0.9, 0.98], "model_cfg": self.model_cfg}


def pretrain(
    settings: PretrainSettings, out_dir: str | Path | None = None, *, command: str | None = None, progress: bool = True
) -> dict[str, Any]:
    """Train a fresh tiny model as ``settings`` say; write an HF directory to ``out_dir`` (if given) and return
    the record that goes into its ``pretrain.json`` (``command``: the line that reproduces it)."""
    s = settings
    if s.steps < 1 or s.batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={s.steps}, batch_size={s.batch_size}")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        positions = s.model_cfg.get("max_position_embeddings", COMMON["max_position_embeddings"])
        tokenizer = build_char_tokenizer(positions)  # its model_max_length: the model's context (64 for arithmetic)
        the_task = _make_task(s.task, s.digits, s.ops)
        ids = dict(
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
        model = build_tiny_model(s.kind, vocab_size=len(tokenizer), seed=s.seed, **ids, **s.model_cfg)
        torch.manual_seed(s.seed)
        history, step, train_s = _train_loop(model, tokenizer, the_task, s, progress)
        record: dict[str, Any] = {
            "command": command,
            "args": s.record_args(),
            "steps_run": step,
            "train_time_s": round(train_s, 2),
            "params": count_params(model),
            "final_loss": history[-1]["loss"] if history else None,
            "history": history,
        }
        if s.final_eval_problems > 0:
            record["final"] = final_scores(model, tokenizer, the_task, s.final_eval_problems, s.eval_k)
        if out_dir is not None:
            save_policy(model, tokenizer, out_dir, record)
        return record
    finally:
        torch.set_num_threads(old_threads)


def _train_loop(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Any, s: PretrainSettings, progress: bool
) -> tuple[list[dict[str, Any]], int, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / max(s.warmup, 1)))
    eval_set = list(task.problems("eval", s.seed))[: s.eval_problems] if s.eval_every > 0 else []
    history: list[dict[str, Any]] = []
    batches = _batches(task, s.seed, s.batch_size)
    model.train()
    t0, eval_s, step, loss_ema = time.perf_counter(), 0.0, 0, float("nan")
    columns = [
        TextColumn("pretrain"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    with Progress(*columns, disable=not progress, transient=False) as bar:
        job = bar.add_task("pretrain", total=s.steps, info="")
        for step in range(1, s.steps + 1):
            prompts, answers = next(batches)
            loss = model(**encode_batch(tokenizer, prompts, answers)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            value = loss.item()
            loss_ema = value if step == 1 else 0.95 * loss_ema + 0.05 * value
            bar.update(job, advance=1, info=f"loss {loss_ema:.3f}")
            if s.eval_every > 0 and step % s.eval_every == 0:
                e0 = time.perf_counter()
                scored = _periodic_score(model, tokenizer, task, eval_set, s.eval_k, step)
                model.train()
                eval_s += time.perf_counter() - e0
                train_s = time.perf_counter() - t0 - eval_s
                history.append({"step": step, "loss": value, "train_s": round(train_s, 2), **scored})
                bar.update(job, info=f"loss {loss_ema:.3f} avg@{s.eval_k} {scored['avg_at_k']:.3f}")
                if s.stop_avg is not None and scored["avg_at_k"] >= s.stop_avg:
                    break
    if not history or history[-1]["step"] != step:
        history.append({"step": step, "loss": value})
    model.eval()
    return history, step, time.perf_counter() - t0 - eval_s


def _periodic_score(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Any, problems: list, k: int, step: int
) -> dict[str, Any]:
    """The score every ``eval_every`` steps. A task that declares ``max_new_tokens`` (long responses: countdown_trace)
    is scored through the KV-cached torch engine, as the final score is: the sampler re-runs the whole sequence for
    each token, fine for arithmetic's 5-token answers, not for 240-token traces. Arithmetic keeps the sampler, so
    its calibration history stays as it was."""
    if getattr(task, "max_new_tokens", None) is None:
        return score(model, tokenizer, problems, task.reward, k=k, seed=10_000 + step)
    scored = final_scores(model, tokenizer, task, len(problems), k, problems=problems)
    return {key: scored[key] for key in ("avg_at_k", "greedy_acc", "pass_at_k", "k", "n_problems")}


def final_scores(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Any, n_problems: int, k: int = 8,
    problems: list | None = None,
) -> dict[str, Any]:
    """avg@k (temperature 1) and greedy accuracy on the first ``n_problems`` eval problems (or on ``problems``),
    through ``satrl.tasks.evaluate`` and the torch engine (both always installed: they are satrl itself). Responses
    are capped at the task's ``max_new_tokens`` where it declares one, else at evaluate's default (16)."""
    from satrl.engines.registry import engine_for
    from satrl.tasks.evaluate import evaluate
    from satrl.types import SamplingParams

    new_tokens = getattr(task, "max_new_tokens", None)
    sampling = SamplingParams(max_new_tokens=new_tokens) if new_tokens is not None else None
    engine = engine_for("torch", tokenizer, model=model, numerics="fp32")  # fp32: as `satrl eval` by default
    result = evaluate(engine, tokenizer, task, k=k, split="eval", n_problems=n_problems, sampling=sampling, seed=0,
                      problems=problems)  # fmt: skip
    return {**result.as_dict(), "scorer": "satrl.tasks.evaluate(TorchEngine)"}


def save_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, record: dict[str, Any]
) -> Path:
    """Write an HF directory: config.json, model.safetensors, tokenizer files and pretrain.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "pretrain.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


# ------------------------------------------------------------------------------------------- CLI
def add_pretrain_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``satrl pretrain``."""
    parser.add_argument("--model", default="tiny-arith", choices=RECIPES.names(), help="built-in recipe")
    parser.add_argument("--kind", choices=["dense", "moe"], help="override the recipe's model kind")
    parser.add_argument("--task", help="task name (default: the recipe's: arithmetic, countdown_trace)")
    parser.add_argument("--digits", type=int, help="arithmetic operand digits (recipe: 3)")
    parser.add_argument("--ops", help="arithmetic operators, e.g. '+' or '+-' (recipe: '+')")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (results depend on it)")
    parser.add_argument("--eval-every", type=int, default=0, help="score avg@8 every N steps (0: off)")
    parser.add_argument("--eval-problems", type=int, default=100)
    parser.add_argument("--stop-avg", type=float, help="stop at the first periodic avg@8 >= this")
    parser.add_argument("--final-eval-problems", type=int, default=200)
    parser.add_argument("--out", required=True, help="output HF directory")
    parser.add_argument("--no-progress", action="store_true")


def command_line(args: argparse.Namespace) -> str:
    """The canonical ``satrl pretrain ...`` command that reproduces ``args`` (defaults omitted)."""
    parts = ["satrl", "pretrain", "--model", args.model, "--steps", str(args.steps), "--seed", str(args.seed)]
    defaults = argparse.ArgumentParser()
    add_pretrain_args(defaults)
    base = vars(defaults.parse_args(["--steps", "1", "--out", "x"]))
    for key, value in vars(args).items():
        if key in ("model", "steps", "seed", "out", "no_progress") or key not in base or value == base[key]:
            continue
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join([*parts, "--out", str(args.out)])


def run_pretrain(args: argparse.Namespace) -> int:
    """Handler of ``satrl pretrain``: train, write ``--out``, print the final scores. Returns 0. The live bar is
    drawn on a terminal only; in a pipe or log file just the final line prints, and transformers' bars (the
    shard bar of a model load) stay off either way."""
    import sys

    from satrl.models.loading import quiet_progress_bars

    recipe = RECIPES.get(args.model)
    with quiet_progress_bars():
        record = _run(args, recipe, progress=not args.no_progress and sys.stdout.isatty())
    final = record.get("final")
    scores = f" avg@8 = {final['avg_at_k']:.3f}, greedy = {final['greedy_acc']:.3f}" if final else ""
    print(f"wrote {args.out}: {record['steps_run']} steps in {record['train_time_s']:.0f} s;{scores}")
    return 0


def _run(args: argparse.Namespace, recipe: dict, progress: bool) -> dict[str, Any]:
    defaults = PretrainSettings()  # a recipe without digits/ops (countdown) records the defaults, unused by its task
    settings = PretrainSettings(
        kind=args.kind or recipe["kind"],
        task=args.task or recipe["task"],
        digits=args.digits if args.digits is not None else recipe.get("digits", defaults.digits),
        ops=args.ops or recipe.get("ops", defaults.ops),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        seed=args.seed,
        threads=args.threads,
        eval_every=args.eval_every,
        eval_problems=args.eval_problems,
        stop_avg=args.stop_avg,
        final_eval_problems=args.final_eval_problems,
        model_cfg=dict(recipe.get("model_cfg", {})),
    )
    return pretrain(settings, args.out, command=command_line(args), progress=progress)
