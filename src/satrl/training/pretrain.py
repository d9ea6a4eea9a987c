"""Supervised next-token training of a tiny base policy on a task's train split (``satrl pretrain``, whose
command line is :mod:`satrl.apps.pretrain`).

The sequence of one problem is ``<bos> prompt answer <eos>``; the loss is the mean cross-entropy over the
answer and EOS tokens only (prompt tokens are labelled -100). AdamW, lr 1e-3, betas (0.9, 0.98), weight
decay 0, a linear warm-up over the first ``warmup`` steps and then a constant rate, gradient-norm clip 1.

The schedule never looks at the total number of steps, on purpose: a run with ``--steps N`` is exactly
the first N steps of any longer run with the same seed. Calibration is therefore "train long, score
every few hundred steps, pick the N where avg@8 lands in the target band, rerun with ``--steps N``".
Everything is deterministic for ``seed`` *and* ``threads`` (CPU matmul reductions depend on the thread
count), so both are recorded in ``pretrain.json`` together with the exact command.

**Micro-batches** (``--micro-batch-size M``, default 0: the whole batch in one pass). A batch is padded to its longest
sequence; with long, varied responses (countdown traces) most of that compute is padding. With M > 0 the batch's rows
are sorted by length (stable), cut into consecutive chunks of M rows, each padded only to its own longest row, and each
chunk's loss is backpropagated weighted by its share of the batch's label tokens: the accumulated gradient is the
whole batch's mean cross-entropy gradient up to float summation order, so M changes the trajectory in the last bits
only, but it does change it, and it is recorded (and must match on ``--resume``). The tiny MoE adds no router aux loss
to ``.loss`` (``output_router_logits=False``, coefficient 0): a model_cfg that turns one on is refused with M > 0, as
a batch statistic of the router does not split into chunks.

**Resume** (``--save-every N``, ``--resume``): every N steps (and at the last step) the run's whole state is written
to ``<out>/resume/``; ``--resume`` continues from it bit-identically to an uninterrupted run, regenerating the train
stream up to where it stopped (cheap: 384k countdown problems take ~10 s). See :mod:`satrl.training.pretrain_state`.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import itertools
import json
import math
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
from satrl.training import pretrain_state
from satrl.training.pretrain_state import LoopState, ResumeError


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


def micro_batches(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """The rows of ``batch`` sorted by length (stable), in consecutive chunks of ``size`` rows, each cut to its own
    longest row: right padding beyond it is neither attended to nor labelled, so the cut changes no real logit."""
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks = []
    for start in range(0, len(order), size):
        rows = torch.tensor(order[start : start + size])
        width = max(lengths[i] for i in rows.tolist())
        chunks.append({k: v[rows, :width] for k, v in batch.items()})
    return chunks


def _label_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The tokens the model's loss averages over (it shifts the labels by one: position 0 is never a target)."""
    return int((batch["labels"][:, 1:] != -100).sum())


def accumulate_gradient(model: PreTrainedModel, batch: dict[str, torch.Tensor], size: int) -> float:
    """Backpropagate ``batch``'s mean cross-entropy in micro-batches of ``size`` rows into the (zeroed) gradients;
    returns that mean. Each chunk's mean loss is weighted by its share of the label tokens, so the sum is the
    batch's mean over all of them."""
    total, value = _label_tokens(batch), 0.0
    for chunk in micro_batches(batch, size):
        loss = model(**chunk).loss * (_label_tokens(chunk) / total)
        loss.backward()
        value += loss.item()
    return value


def _batches(task: Any, seed: int, batch_size: int, start: int = 0, last_prompt: str | None = None
             ) -> Iterator[tuple[list[str], list[str]]]:  # fmt: skip
    """The train batches from batch ``start`` on. The ``start`` batches before are regenerated and dropped (the task
    streams hold no resumable position; 384k countdown problems take ~10 s); the last one dropped must have the
    prompt ``last_prompt`` (the saved run's), else the stream is not the saved run's. The skip runs on the call, so
    a mismatch stops the run before its first step."""
    stream = task.problems("train", seed)
    if start > 0:
        skipped = collections.deque(itertools.islice(stream, start * batch_size), maxlen=1)
        if not skipped or skipped[0].prompt != last_prompt:
            got = skipped[0].prompt if skipped else "the end of the stream"
            raise ResumeError(f"the train stream of {getattr(task, 'name', task)} (seed {seed}) is not the saved "
                              f"run's: its problem {start * batch_size} is {got!r}, not {last_prompt!r}")  # fmt: skip
    return _chunks(stream, batch_size)


def _chunks(stream: Iterator[Any], batch_size: int) -> Iterator[tuple[list[str], list[str]]]:
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
        micro_batch_size: rows per forward/backward pass, each padded to its own longest row (0: the whole batch
            in one pass); the gradient is the same up to float summation order (module docstring).
        save_every: write the resume state every this many steps and at the last one (0: never); it does not
            change the result.
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
    micro_batch_size: int = 0
    save_every: int = 0

    def __post_init__(self) -> None:
        if why := self.problem():
            raise ValueError(why)

    def problem(self) -> str | None:
        """Why these settings cannot train, in one line naming the flag, or None: each bounded as the run config
        bounds its field (``--lr`` as ``train.lr``, finite in (0, MAX_LR]; ``--seed`` as ``seed``), so ``--lr inf``
        no longer writes an all-NaN policy and ``--steps 0`` no traceback (issue 60)."""
        from satrl.training.config import MAX_LR

        for name in ("digits", "steps", "batch_size", "threads", "eval_problems", "eval_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"--{name.replace('_', '-')} {value}: must be an integer, at least 1"
        for name in ("warmup", "eval_every", "final_eval_problems", "micro_batch_size", "save_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return f"--{name.replace('_', '-')} {value}: must be an integer, at least 0"
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            return f"--seed {self.seed}: must be an integer in [0, 2^32), as a run's seed"
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            return f"--lr {self.lr}: must be a finite number in (0, {MAX_LR:g}], as train.lr"
        if self.stop_avg is not None and not math.isfinite(self.stop_avg):
            return f"--stop-avg {self.stop_avg}: must be a finite number"
        return None

    def record_args(self) -> dict[str, Any]:
        """The ``args`` of ``pretrain.json`` (the shipped policies' files have exactly these keys); a run with
        micro-batches adds ``micro_batch_size``, which changes the trajectory (in the last bits)."""
        keys = ("kind", "task", "digits", "ops", "steps", "batch_size", "lr", "seed", "warmup", "threads")
        micro = {"micro_batch_size": self.micro_batch_size} if self.micro_batch_size > 0 else {}
        return {**{k: getattr(self, k) for k in keys}, "betas": [0.9, 0.98], "model_cfg": self.model_cfg, **micro}

    def check(self, out_dir: str | Path | None, resume: bool) -> None:
        """One-line ValueErrors for settings that cannot run (a :class:`ResumeError` for a state in the way)."""
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got steps={self.steps}, batch_size={self.batch_size}")
        if self.micro_batch_size < 0 or self.save_every < 0:
            raise ValueError(f"micro_batch_size and save_every must be >= 0, got {self.micro_batch_size}, "
                             f"{self.save_every}")  # fmt: skip
        if out_dir is None and (resume or self.save_every > 0):
            raise ValueError("resume and save_every need an output directory (the state lives in <out>/resume)")
        if out_dir is not None and not resume:
            pretrain_state.check_fresh(out_dir)


def pretrain(
    settings: PretrainSettings, out_dir: str | Path | None = None, *, command: str | None = None, progress: bool = True,
    resume: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Train a fresh tiny model as ``settings`` say (or, with ``resume``, continue the one saved in
    ``out_dir/resume``); write an HF directory to ``out_dir`` (if given) and return the record that goes into its
    ``pretrain.json`` (``command``: the line that reproduces it). The resume state stays after the run: ``--resume``
    with a larger ``--steps`` extends it."""
    s = settings
    s.check(out_dir, resume)
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
        cfg = model.config
        if s.micro_batch_size > 0 and getattr(cfg, "output_router_logits", False) and cfg.router_aux_loss_coef:
            raise ValueError("micro_batch_size > 0 cannot reproduce the router aux loss of the whole batch; "
                             "use micro_batch_size 0 or a model_cfg without output_router_logits")  # fmt: skip
        torch.manual_seed(s.seed)
        history, step, train_s = _train_loop(model, tokenizer, the_task, s, progress, out_dir, resume)
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
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Any, s: PretrainSettings, progress: bool,
    out_dir: str | Path | None = None, resume: bool = False,
) -> tuple[list[dict[str, Any]], int, float]:  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / max(s.warmup, 1)))
    at, settings = LoopState(), dataclasses.asdict(s)
    if resume:
        at = pretrain_state.restore_state(out_dir, model, opt, sched, settings)
        if at.step > s.steps:
            raise ResumeError(f"{pretrain_state.state_root(out_dir)}: the saved run is at step {at.step}, past "
                              f"--steps {s.steps}; ask for at least {at.step}")  # fmt: skip
    eval_set = list(task.problems("eval", s.seed))[: s.eval_problems] if s.eval_every > 0 else []
    batches = _batches(task, s.seed, s.batch_size, start=at.step, last_prompt=at.last_prompt)
    last = at.history[-1] if at.history and at.history[-1]["step"] == at.step else {}
    done = s.stop_avg is not None and last.get("avg_at_k", -1.0) >= s.stop_avg  # a saved run --stop-avg ended
    model.train()
    # t0 and paused_s (evals, saves) time this session; at.train_s holds the earlier sessions' training time
    t0, paused_s, before_s = time.perf_counter(), 0.0, at.train_s
    columns = [TextColumn("pretrain"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[info]}")]  # fmt: skip
    with Progress(*columns, disable=not progress, transient=False) as bar:
        job = bar.add_task("pretrain", total=s.steps, completed=at.step, info="")
        for step in range(at.step + 1, at.step + 1 if done else s.steps + 1):
            prompts, answers = next(batches)
            value = _train_step(model, opt, sched, encode_batch(tokenizer, prompts, answers), s.micro_batch_size)
            at.loss_ema = value if step == 1 else 0.95 * at.loss_ema + 0.05 * value
            at.step, at.loss, at.last_prompt = step, value, prompts[-1]
            bar.update(job, advance=1, info=f"loss {at.loss_ema:.3f}")
            stop = False
            if s.eval_every > 0 and step % s.eval_every == 0:
                e0 = time.perf_counter()
                scored = _periodic_score(model, tokenizer, task, eval_set, s.eval_k, step)
                model.train()
                paused_s += time.perf_counter() - e0
                train_s = before_s + time.perf_counter() - t0 - paused_s
                at.history.append({"step": step, "loss": value, "train_s": round(train_s, 2), **scored})
                bar.update(job, info=f"loss {at.loss_ema:.3f} avg@{s.eval_k} {scored['avg_at_k']:.3f}")
                stop = s.stop_avg is not None and scored["avg_at_k"] >= s.stop_avg
            if s.save_every > 0 and (step % s.save_every == 0 or stop or step == s.steps):
                w0 = time.perf_counter()
                at.train_s = before_s + w0 - t0 - paused_s
                pretrain_state.save_state(out_dir, model, opt, sched, at, settings)
                paused_s += time.perf_counter() - w0
            if stop:
                break
    if not at.history or at.history[-1]["step"] != at.step:
        at.history.append({"step": at.step, "loss": at.loss})
    model.eval()
    return at.history, at.step, before_s + time.perf_counter() - t0 - paused_s


def _train_step(
    model: PreTrainedModel, opt: torch.optim.Optimizer, sched: Any, batch: dict[str, torch.Tensor], micro: int
) -> float:
    """One optimizer step on ``batch``; returns its mean loss. ``micro`` 0 is the one-pass code path the shipped
    arithmetic bases were trained with, kept as it was so that their recorded commands reproduce them bit for bit."""
    if micro > 0:
        opt.zero_grad(set_to_none=True)
        value = accumulate_gradient(model, batch, micro)
    else:
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value = None
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item() if value is None else value


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
    from satrl.engines.numerics import EVAL_NUMERICS
    from satrl.engines.registry import engine_for
    from satrl.tasks.evaluate import evaluate
    from satrl.types import SamplingParams

    new_tokens = getattr(task, "max_new_tokens", None)
    sampling = SamplingParams(max_new_tokens=new_tokens) if new_tokens is not None else None
    engine = engine_for("torch", tokenizer, model=model, numerics=EVAL_NUMERICS)  # as `satrl eval` by default
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
