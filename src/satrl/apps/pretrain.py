"""``satrl pretrain``: the command line of supervised pretraining (:mod:`satrl.training.pretrain`, the library).

Flags become :class:`~satrl.training.pretrain.PretrainSettings` (a built-in recipe, ``RECIPES``, fills the model
kind, task, digits and ops); the run writes an HF directory to ``--out`` whose ``pretrain.json`` records the
canonical command that reproduces it (:func:`command_line`). A resume state missing, in the way, damaged or saved
with other flags is one line and exit 2; Ctrl-C exits 130, naming the command that resumes it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from satrl.training.recipes import RECIPES


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
    parser.add_argument("--micro-batch-size", type=int, default=0,
                        help="rows per forward/backward pass, each padded to its own longest row; same gradient up to "
                             "float order (0: the whole batch in one pass)")  # fmt: skip
    parser.add_argument("--save-every", type=int, default=0,
                        help="write a resume state to OUT/resume every N steps and at the last (0: never)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in OUT/resume (same flags)")
    parser.add_argument("--out", required=True, help="output HF directory")
    parser.add_argument("--no-progress", action="store_true")


# The flags command_line leaves out: placed first or last by hand, or not changing the weights.
_UNRECORDED = ("model", "steps", "seed", "out", "no_progress", "save_every", "resume")


def command_line(args: argparse.Namespace) -> str:
    """The canonical ``satrl pretrain ...`` command that reproduces ``args`` (defaults omitted). ``--save-every`` and
    ``--resume`` are left out: they do not change the weights, and a recorded ``--resume`` could not run anew."""
    parts = ["satrl", "pretrain", "--model", args.model, "--steps", str(args.steps), "--seed", str(args.seed)]
    defaults = argparse.ArgumentParser()
    add_pretrain_args(defaults)
    base = vars(defaults.parse_args(["--steps", "1", "--out", "x"]))
    for key, value in vars(args).items():
        if key in _UNRECORDED or key not in base or value == base[key]:
            continue
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join([*parts, "--out", str(args.out)])


def run_pretrain(args: argparse.Namespace) -> int:
    """Handler of ``satrl pretrain``: train, write ``--out``, print the final scores. Returns 0 (2, with one line: a
    resume state missing, in the way, damaged or saved with other flags; 130: interrupted). The live bar is
    drawn on a terminal only; in a pipe or log file just the final line prints, and transformers' bars (the
    shard bar of a model load) stay off either way."""
    from satrl.models.loading import quiet_progress_bars
    from satrl.training.checkpoint import CheckpointError
    from satrl.training.pretrain_state import ResumeError

    recipe = RECIPES.get(args.model)
    try:
        settings = _settings(args, recipe)
    except ValueError as err:  # a flag out of its bounds (PretrainSettings.problem): before any work
        print(f"satrl pretrain: {err}", file=sys.stderr)
        return 2
    try:
        with quiet_progress_bars():
            record = _run(args, settings, progress=not args.no_progress and sys.stdout.isatty())
    except (ResumeError, CheckpointError) as err:  # a resume state missing, in the way, damaged or of other flags
        print(f"satrl pretrain: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = f"; continue with {command_line(args)} --save-every {args.save_every} --resume"
        print(f"satrl pretrain: interrupted{again if args.save_every else ''}", file=sys.stderr)
        return 130
    final = record.get("final")
    scores = f" avg@8 = {final['avg_at_k']:.3f}, greedy = {final['greedy_acc']:.3f}" if final else ""
    print(f"wrote {args.out}: {record['steps_run']} steps in {record['train_time_s']:.0f} s;{scores}")
    return 0


def _settings(args: argparse.Namespace, recipe: dict) -> Any:
    """The flags as :class:`~satrl.training.pretrain.PretrainSettings`; a ValueError names a flag out of bounds."""
    from satrl.training.pretrain import PretrainSettings

    defaults = PretrainSettings()  # a recipe without digits/ops (countdown) records the defaults, unused by its task
    return PretrainSettings(
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
        micro_batch_size=args.micro_batch_size,
        save_every=args.save_every,
    )


def _run(args: argparse.Namespace, settings: Any, progress: bool) -> dict[str, Any]:
    from satrl.training.pretrain import pretrain

    return pretrain(settings, args.out, command=command_line(args), progress=progress, resume=args.resume)
