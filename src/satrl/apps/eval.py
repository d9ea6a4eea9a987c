"""``satrl eval``: avg@k and greedy accuracy of a built-in policy, a Hugging Face folder, or a run directory.

A run directory (``satrl eval runs/x``, or ``--model runs/x``) is evaluated at its latest checkpoint (``--step N``:
another kept one) exactly as the run's own evaluator did: the run's task and task arguments, its val and test
problems, k, seed, sampling, engine, engine arguments, numerics and thread count, all read from its
``config.yaml``, so that the scores equal the run's ``eval.jsonl`` row at that step (tests/test_export.py).
Any flag given explicitly overrides the run's setting. A model (a built-in name or an HF folder, e.g. one
``satrl export`` wrote) starts from the flags' defaults instead; ``--val-problems``/``--test-problems`` pick
problems as a run does (the fixed hash split of :func:`satrl.tasks.evaluate.split_val_test`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from satrl.engines.numerics import EVAL_NUMERICS, NUMERICS
from satrl.models.builtins import BUILTINS
from satrl.tasks import GYM_PREFIX, TASKS

if TYPE_CHECKING:  # imported where used: `satrl eval --help` loads no torch
    from satrl.tasks.evaluate import EvalResult
    from satrl.types import SamplingParams

# The flags that override one EvalSettings field each (argparse dest = field name); None: not given.
SCALARS = ("task", "k", "seed", "numerics", "temperature", "top_p", "top_k", "max_new_tokens", "batch_size",
           "device", "engine", "threads", "chat_template", "system_prompt", "add_generation_prompt")  # fmt: skip


@dataclass(frozen=True)
class EvalSettings:
    """Everything one ``satrl eval`` runs with. The defaults are those of a model given by name or folder;
    :meth:`of_run` gives a run's own evaluation; :meth:`overridden` applies the flags given explicitly."""

    task: str = "arithmetic"
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    k: int = 8
    seed: int = 0
    numerics: str = EVAL_NUMERICS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    batch_size: int = 256
    device: str = "cpu"
    engine: str = "torch"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    n_problems: int | None = None  # the first N eval problems (None: all, or the val/test parts below)
    val_problems: int = 0  # > 0 or test_problems > 0: the val and test parts, as a run's evaluator picks them
    test_problems: int = 0
    threads: int | None = None  # torch threads for generation (None: torch's default)
    chat_template: bool = False  # model.chat: prompts through the tokenizer's chat template (satrl.models.chat)
    system_prompt: str | None = None
    add_generation_prompt: bool = True

    @classmethod
    def of_run(cls, cfg) -> EvalSettings:
        """The settings of a run's evaluator (:func:`satrl.launch.setup.build_evaluator`): it runs in
        the trainer's process, so at the trainer's thread count, with the rollout engine's numerics."""
        from satrl.launch.setup import eval_engine_kwargs

        kwargs, e = eval_engine_kwargs(cfg), cfg.engine
        return cls(task=cfg.task.name, task_kwargs=cfg.task_kwargs, k=cfg.eval.k, seed=cfg.seed, numerics=e.numerics,
                   temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_new_tokens=e.max_new_tokens,
                   device=kwargs.pop("device", "cpu"), engine=cfg.eval.engine or e.name, engine_kwargs=kwargs,
                   val_problems=cfg.eval.val_problems, test_problems=cfg.eval.test_problems,
                   threads=cfg.trainer_threads, chat_template=cfg.model.chat.template,
                   system_prompt=cfg.model.chat.system_prompt,
                   add_generation_prompt=cfg.model.chat.add_generation_prompt)  # fmt: skip

    def overridden(self, args: argparse.Namespace) -> EvalSettings:
        """These settings with every flag given in ``args`` applied. Another task (engine) than these settings'
        drops their task (engine) arguments, which belong to the one they replace."""
        given = {name: getattr(args, name) for name in SCALARS if getattr(args, name) is not None}
        s = dataclasses.replace(self, **given)
        task_kwargs = s.task_kwargs if s.task == self.task else {}
        engine_kwargs = s.engine_kwargs if s.engine == self.engine else {}
        s = dataclasses.replace(s, task_kwargs={**task_kwargs, **_pairs(args.task_arg, "--task-arg")},
                                engine_kwargs={**engine_kwargs, **_pairs(args.engine_arg, "--engine-arg")})  # fmt: skip
        parts = (args.val_problems, args.test_problems)
        if args.n_problems is not None:
            if parts != (None, None):
                raise ValueError("--n-problems and --val-problems/--test-problems both choose the problems; give one")
            return dataclasses.replace(s, n_problems=args.n_problems, val_problems=0, test_problems=0)
        if parts != (None, None):
            s = dataclasses.replace(s, n_problems=None, val_problems=args.val_problems or 0,
                                    test_problems=args.test_problems or 0)  # fmt: skip
        return s

    def flags(self) -> list[str]:
        """The ``satrl eval`` flags that give these settings to a model folder (``satrl export`` prints them)."""
        out = ["--task", self.task, *_pair_flags("--task-arg", self.task_kwargs), "--k", str(self.k),
               "--seed", str(self.seed), "--numerics", self.numerics, "--temperature", repr(self.temperature),
               "--top-p", repr(self.top_p), "--top-k", str(self.top_k), "--max-new-tokens", str(self.max_new_tokens),
               "--engine", self.engine, *_pair_flags("--engine-arg", self.engine_kwargs)]  # fmt: skip
        if self.device != "cpu":
            out += ["--device", self.device]
        if self.n_problems is not None:
            out += ["--n-problems", str(self.n_problems)]
        elif self.val_problems or self.test_problems:
            out += ["--val-problems", str(self.val_problems), "--test-problems", str(self.test_problems)]
        if self.chat_template:  # the run's model.chat: an exported folder is prompted as the run was
            out += ["--chat-template", *(["--system-prompt", self.system_prompt] if self.system_prompt is not None else []),
                    *([] if self.add_generation_prompt else ["--no-generation-prompt"])]  # fmt: skip
        return out + (["--threads", str(self.threads)] if self.threads is not None else [])

    def chat(self):
        """The :class:`~satrl.models.chat.ChatFormat` of these settings; ``ValueError`` for a system prompt that
        no prompt would carry."""
        from satrl.models.chat import ChatFormat

        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("--system-prompt needs --chat-template (model.chat.template=true)")
        return ChatFormat(self.chat_template, self.system_prompt, self.add_generation_prompt)

    def sampling(self) -> SamplingParams:
        from satrl.types import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens)  # fmt: skip


def _pairs(pairs: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` flags as a dict, each value YAML-typed (``digits=3`` is an int)."""
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        kwargs[key] = yaml.safe_load(value)
    return kwargs


def _pair_flags(flag: str, kwargs: dict[str, Any]) -> list[str]:
    # JSON is YAML: each value reads back as it was (a string stays a string, a list a list)
    return [x for k, v in kwargs.items() for x in (flag, f"{k}={json.dumps(v)}")]


def add_eval_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``satrl eval``. A flag left out keeps the default shown, or a run directory's own setting."""
    parser.add_argument("path", nargs="?", metavar="RUN_DIR", help="a run directory: evaluate its latest checkpoint "
                        "as the run did (its config.yaml's settings; flags override them)")  # fmt: skip
    parser.add_argument("--model", help=f"built-in name ({', '.join(BUILTINS.names())}), HF dir, or a run directory")
    parser.add_argument("--step", type=int,
                        help="run directory: evaluate the checkpoint of this step (default: latest)")  # fmt: skip
    parser.add_argument("--task", help=f"{' | '.join(TASKS.names())} | {GYM_PREFIX}<name> (default: arithmetic)")
    parser.add_argument(
        "--task-arg", action="append", default=[], metavar="KEY=VALUE",
        help="task constructor argument, YAML-typed (e.g. digits=3, path=aime24.jsonl); repeatable",
    )
    parser.add_argument("--k", type=int, help="samples per problem for avg@k, in [1, 4096] as eval.k (default: 8)")
    parser.add_argument("--n-problems", type=int, help="first N eval problems (default: all)")
    parser.add_argument("--val-problems", type=int, help="N problems of the val part, as a run's evaluator picks them")
    parser.add_argument("--test-problems", type=int,
                        help="N problems of the test part, as a run's evaluator picks them")  # fmt: skip
    parser.add_argument("--seed", type=int, help="in [0, 2^32) as a run's seed (default: 0)")
    parser.add_argument("--numerics", help=f"engine numerics: {' | '.join(NUMERICS.names())} (default: {EVAL_NUMERICS})")
    parser.add_argument("--temperature", type=float, help="in [0.01, 100] as engine.temperature (default: 1.0)")
    parser.add_argument("--top-p", type=float, help="in (0, 1] as engine.top_p (default: 1.0)")
    parser.add_argument("--top-k", type=int, help="0 = off (default: 0)")
    parser.add_argument("--max-new-tokens", type=int, help="default: 16")
    parser.add_argument("--batch-size", type=int, help="default: 256")
    parser.add_argument("--device", help="torch engine device (vLLM picks its own platform; default: cpu)")
    parser.add_argument("--engine", help="rollout engine: torch | vllm (needs vLLM, docs/vllm.md; default: torch)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="engine argument, YAML-typed (e.g. gpu_memory_utilization=0.5); repeatable")  # fmt: skip
    parser.add_argument("--threads", type=int, help="torch threads for generation (default: torch's own)")
    parser.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=None,
                        help="encode prompts with the tokenizer's chat template, as model.chat.template "
                        "(default: off, or the run's)")  # fmt: skip
    parser.add_argument("--system-prompt", metavar="TEXT", help="system message, as model.chat.system_prompt")
    parser.add_argument("--generation-prompt", dest="add_generation_prompt", action=argparse.BooleanOptionalAction,
                        default=None, help="end a rendered prompt with the assistant header, as "
                        "model.chat.add_generation_prompt (default: on)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line")


# Flags that count something and have no field of a run's config: the least each may be (a --batch-size 0 said
# "range() arg 3 must not be zero").
AT_LEAST = {"n_problems": 1, "val_problems": 0, "test_problems": 0, "batch_size": 1}

# Flags that set what a run's config sets: (section, field) of the run config, whose bounds they obey (one source of
# truth: --k 1e9 hung, --temperature inf and --seed -1 were taken where `satrl train` refused them; issue 60).
CONFIG_FIELDS = {"k": ("eval", "k"), "seed": (None, "seed"), "temperature": ("engine", "temperature"),
                 "top_p": ("engine", "top_p"), "top_k": ("engine", "top_k"),
                 "max_new_tokens": ("engine", "max_new_tokens"), "threads": ("engine", "threads")}  # fmt: skip


def _config_problem(name: str, value: Any) -> str | None:
    """Why the run config would refuse ``value`` for the field flag ``name`` sets, or None."""
    from pydantic import ValidationError

    from satrl.config import RunConfig

    section, key = CONFIG_FIELDS[name]
    model = RunConfig if section is None else RunConfig.model_fields[section].annotation
    try:
        model.__pydantic_validator__.validate_assignment(model.model_construct(), key, value)
    except ValidationError as err:
        first = err.errors()[0]
        msg = str(first["ctx"]["error"]) if first["type"] == "value_error" and "error" in first.get("ctx", {}) else first["msg"]
        return f"{msg} (as {key if section is None else f'{section}.{key}'} in a run's config)"
    return None


def _check_flags(args: argparse.Namespace) -> None:
    """``ValueError`` naming the first flag given with a value it cannot take."""
    for name, least in AT_LEAST.items():
        value = getattr(args, name, None)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be at least {least}")
    for name in CONFIG_FIELDS:
        value = getattr(args, name, None)
        if value is not None and (why := _config_problem(name, value)):
            raise ValueError(f"--{name.replace('_', '-')} {value}: {why}")


def _fail(e: BaseException) -> int:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"satrl eval: error: {msg}", file=sys.stderr)
    return 2


@dataclass
class _Target:
    """What is evaluated: a policy ``source`` (name or folder) and, for a run, the checkpoint on top of it."""

    source: str
    settings: EvalSettings
    checkpoint: Path | None = None


def _target(args: argparse.Namespace) -> _Target:
    from satrl.apps.runs import checkpoint_of, is_run_dir, run_config

    if args.path is not None and args.model is not None:
        raise ValueError(f"give the run directory or --model, not both ({args.path}, {args.model})")
    where = args.path if args.path is not None else args.model
    if where is None:
        raise ValueError("nothing to evaluate: give a run directory (satrl eval runs/x) or --model NAME_OR_DIR")
    if not is_run_dir(where):
        if args.step is not None:
            raise ValueError(f"--step needs a run directory; {where} is a model")
        return _Target(where, EvalSettings().overridden(args))
    cfg = run_config(where, args.step)  # one line naming the folder when it has no config.yaml
    return _Target(cfg.model.source, EvalSettings.of_run(cfg).overridden(args), checkpoint_of(where, args.step))


def _evaluate(t: _Target) -> tuple[EvalResult, dict[str, list[int]]]:
    """Score the target; the result and, when the val/test parts were asked for, each part's positions."""
    import torch

    from satrl.apps.runs import checkpoint_step, checkpoint_weights
    from satrl.config_base import check_device_here
    from satrl.engines import resolve_numerics
    from satrl.engines.registry import engine_for
    from satrl.models import load_tokenizer
    from satrl.tasks import make_task
    from satrl.tasks.evaluate import evaluate, split_val_test

    s = t.settings
    task, sampling, chat = make_task(s.task, **s.task_kwargs), s.sampling(), s.chat()
    resolve_numerics(s.numerics)  # fail before loading the model
    check_device_here(s.device, "--device")  # cpu, cuda or cuda:N, and one this machine has
    if s.threads is not None:
        torch.set_num_threads(s.threads)  # a run's evaluator ran at its trainer's count: the same bits
    weights = checkpoint_weights(t.checkpoint) if t.checkpoint is not None else None
    problems, parts = None, {}
    if s.val_problems or s.test_problems:
        problems, val, test = split_val_test(task.problems("eval", 0), s.val_problems, s.test_problems)
        parts = {"val": val, "test": test}
    tokenizer = load_tokenizer(t.source)
    try:
        engine = engine_for(s.engine, tokenizer, model_path=t.source, numerics=s.numerics, device=s.device,
                            **s.engine_kwargs)  # fmt: skip
    except TypeError as err:  # an argument this engine does not take: the user's --engine-arg or the run's
        raise ValueError(f"engine {s.engine}: {err} (see --engine-arg, or the run's engine.kwargs)") from None
    try:
        if weights is not None:  # what the run's evaluator does: the base policy's engine, the trained weights
            engine.load_weights(weights, checkpoint_step(t.checkpoint))
        result = evaluate(engine, tokenizer, task, k=s.k, n_problems=s.n_problems, sampling=sampling, seed=s.seed,
                          batch_size=s.batch_size, problems=problems, chat=chat)  # fmt: skip
    finally:
        close = getattr(engine, "close", None)
        if close is not None:  # vLLM: stop its processes (and their log lines) before printing the result
            close()
    return result, parts


def run_eval(args: argparse.Namespace) -> int:
    """Handler of ``satrl eval``: prints ``avg@K = x.xxx`` and ``greedy_acc = x.xxx``, then each val/test part and
    the settings. Returns 0, or 2 with a one-line message on stderr for a bad task, model, run or setting."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for our one-line errors
    try:
        _check_flags(args)
        target = _target(args)
        result, parts = _evaluate(target)
    except (ValueError, OSError, ImportError, KeyError) as e:  # bad user input: one line, exit 2
        return _fail(e)
    _report(target, result, parts, args.json)
    return 0


def _report(t: _Target, result: EvalResult, parts: dict[str, list[int]], as_json: bool) -> None:
    from satrl.tasks.evaluate import part_scores

    s, k = t.settings, result.k
    record = result.as_dict()
    print(f"avg@{k} = {result.avg_at_k:.3f}")
    print(f"greedy_acc = {result.greedy_acc:.3f}")
    print(f"({result.task}, {result.n_problems} problems, k={k}, pass@{k} = {result.pass_at_k:.3f}, "
          f"temperature={s.temperature}, top_p={s.top_p}, top_k={s.top_k}, max_new_tokens={s.max_new_tokens}, "
          f"numerics={s.numerics}, engine={s.engine}, seed={result.seed})")  # fmt: skip
    record["sampled_entropy"] = result.sampled_entropy  # the sampling distribution's, estimated (tasks.evaluate)
    print(f"sampled entropy = {result.sampled_entropy:.4f} nats/token (mean -log mu over the {sum(result.sampled_tokens)} "
          f"response tokens of the k samples)")  # fmt: skip
    if s.chat_template:  # as the run's eval.jsonl has it
        record["prompt_tokens"] = sum(result.prompt_tokens) / len(result.prompt_tokens)
        print(f"prompt_tokens = {record['prompt_tokens']:.1f} (mean, as the chat template rendered them)")
    for part, idx in parts.items():
        if idx:  # the keys of the run's eval.jsonl
            scores = part_scores(result, idx)
            record.update({f"{part}_{name}": v for name, v in scores.items()})
            record[f"{part}_n"] = len(idx)
            print(f"{part}: avg@{k} = {scores['avg_at_k']:.3f}, greedy_acc = {scores['greedy_acc']:.3f} "
                  f"({len(idx)} problems)")  # fmt: skip
    if t.checkpoint is not None:
        _report_run(t.checkpoint, record)
    if as_json:
        print(json.dumps(record))


def _report_run(checkpoint: Path, record: dict) -> None:
    """Which checkpoint was scored, and what the run logged there (equal with the run's own settings)."""
    from satrl.apps.runs import checkpoint_step, logged_eval

    step = checkpoint_step(checkpoint)
    record.update(checkpoint=str(checkpoint), step=step)
    logged = logged_eval(checkpoint.parent.parent, step)
    said = "" if logged is None else "; the run logged " + ", ".join(
        f"{key} = {logged[key]:.3f}" for key in ("avg_at_k", "val_avg_at_k", "test_avg_at_k") if key in logged)
    print(f"checkpoint: {checkpoint} (step {step}){said}")
