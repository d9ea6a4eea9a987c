"""Adapter for ``reasoning-gym``'s procedural tasks (e.g. ``countdown``, the TinyZero task).

``reasoning_gym.create_dataset(name, size=, seed=, **config)`` gives entries ``{question, answer,
metadata}`` and ``dataset.score_answer(answer, entry) -> float`` in [0, 1]. Many scorers give partial
credit (countdown: 0.05 for a well-formed wrong expression, 0.01 for none), so the reward here is
thresholded: **1.0 iff the score is >= 1.0, else 0.0**, keeping every task's reward in {0, 1}.

What is scored is ``extract(completion_text)``: by default the whole completion (``extract="none"``);
``extract="answer_tag"`` takes the last ``<answer>...</answer>`` (reasoning-gym's own ``extract_answer``,
the TinyZero format); ``extract="last_number"`` the last number in the text (a chat model's "The answer is 578.");
any ``Callable[[str], str | None]`` works too.

Splits. reasoning-gym draws item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``, so datasets
with nearby seeds share items. We keep the splits apart twice over: eval items come from seeds at
``2**40 + eval_seed`` while train seeds are below ``2**32``, and any train item whose question equals an
eval question is skipped (counted in :attr:`ReasoningGymTask.n_overlap_skipped`). The choice of split and seed, and
the eval draws kept per seed, are the logic all tasks share (:mod:`satrl.tasks.splits`).
- ``eval``: ``n_eval`` items, the same for every seed unless ``eval_seed=None``.
- ``train``: ``size`` distinct items for the stream's seed (mixed with the task's ``seed``), repeated
  as an endless stream of epochs, each shuffled by ``(seed, epoch)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from satrl.registry import Registry
from satrl.tasks import check_template
from satrl.tasks.splits import Splits
from satrl.types import Problem

EVAL_SEED_BASE = 2**40


def _whole(text: str) -> str | None:
    return text


def _answer_tag(text: str) -> str | None:
    from reasoning_gym.utils import extract_answer

    return extract_answer(text, tag_name="answer")


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_number(text: str) -> str | None:
    """The last number in the text, thousands separators dropped ("The answer is 1,234." -> "1234"), a trailing
    ".0" kept as written; None when there is none. What an instruction-tuned model's prose answer is scored on
    (GSM8K's and lm-eval-harness's flexible extract)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


EXTRACTORS: Registry[Callable[[str], str | None]] = Registry(
    "extract", {"none": _whole, "answer_tag": _answer_tag, "last_number": _last_number}
)


@dataclass(frozen=True)
class GymOptions:
    """A reasoning-gym task's own options: the ``task.kwargs`` keys below (same defaults); any other key is the
    dataset's config (:meth:`ReasoningGymTask.from_kwargs` sorts them).

    Attributes:
        size: distinct train items per stream seed.
        seed: base seed of the train datasets.
        n_eval: number of eval items.
        eval_seed: seed of the eval dataset; ``None`` = the seed passed to :meth:`ReasoningGymTask.problems`.
        prompt_template: ``str.format`` template with a ``{question}`` field.
        extract: ``"none"``, ``"answer_tag"``, ``"last_number"`` or a callable mapping the completion to the scored
            answer.
    """

    size: int = 10_000
    seed: int = 0
    n_eval: int = 100
    eval_seed: int | None = 0
    prompt_template: str = "{question}"
    extract: str | Callable[[str], str | None] = "none"


class ReasoningGymTask:
    """A reasoning-gym dataset as a :class:`satrl.types.Task`; see the module docstring.

    Args:
        dataset_name: a reasoning-gym dataset name (``countdown``, ``basic_arithmetic``, ...).
        options: the task's own settings (:class:`GymOptions`); checked here, each bad value refused in one line.
        **config: the dataset's own config fields (e.g. ``min_numbers=3`` for countdown).
    """

    @classmethod
    def from_kwargs(cls, dataset_name: str, **kwargs: Any) -> ReasoningGymTask:
        """The task as ``task.kwargs`` give it: the :class:`GymOptions` keys are its options, the rest the
        dataset's config."""
        own = {f.name for f in dataclasses.fields(GymOptions)}
        options = GymOptions(**{k: v for k, v in kwargs.items() if k in own})
        return cls(dataset_name, options, **{k: v for k, v in kwargs.items() if k not in own})

    def __init__(self, dataset_name: str, options: GymOptions = GymOptions(), **config: Any) -> None:
        size, seed, n_eval, eval_seed = options.size, options.seed, options.n_eval, options.eval_seed
        prompt_template, extract = options.prompt_template, options.extract
        import reasoning_gym
        from reasoning_gym.factory import DATASETS

        if dataset_name not in DATASETS:
            raise ValueError(
                f"unknown reasoning-gym dataset {dataset_name!r}; valid choices: {sorted(DATASETS)}"
            )
        if isinstance(extract, str):
            extract = EXTRACTORS.get(extract)
        if size < 1 or n_eval < 1:
            raise ValueError(f"size and n_eval must be >= 1, got size={size}, n_eval={n_eval}")
        check_template(prompt_template, "question")
        config_cls = DATASETS[dataset_name][1]
        if dataclasses.is_dataclass(config_cls):
            fields = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
            unknown = sorted(set(config) - set(fields))
            if unknown:
                raise ValueError(f"unknown {dataset_name} config {unknown}; valid choices: {fields}")
        self._create = reasoning_gym.create_dataset
        self.dataset_name = dataset_name
        self.size, self.seed = size, seed
        self.n_eval, self.eval_seed = n_eval, eval_seed
        self.prompt_template = prompt_template
        self.extract = extract
        self.config = config
        self.options = options
        self.name = f"gym:{dataset_name}"
        self.n_overlap_skipped = 0
        # problem id -> (dataset, entry): what score_answer needs. Bounded by size per seed + n_eval.
        self._entries: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.splits = Splits(eval_seed, self._eval_problems, self._train_stream)
        self._dataset(0, 1)  # fail now, not mid-run, on a bad config

    def _dataset(self, ds_seed: int, size: int) -> Any:
        return self._create(self.dataset_name, size=size, seed=ds_seed, **self.config)

    def _problem(self, pid: str, dataset: Any, entry: dict[str, Any]) -> Problem:
        self._entries[pid] = (dataset, entry)
        answer = entry.get("answer")
        prompt = self.prompt_template.format(question=entry["question"])
        return Problem(id=pid, prompt=prompt, answer="" if answer is None else str(answer))

    # ----------------------------------------------------------------------------- Task protocol
    def problems(self, split: str, seed: int = 0) -> Iterator[Problem]:
        return self.splits.problems(split, seed)

    def reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 iff reasoning-gym scores the extracted answer >= 1.0 (partial credit counts as 0)."""
        if problem.id not in self._entries:
            raise ValueError(f"{self.name} can only score problems it produced; unknown id {problem.id!r}")
        dataset, entry = self._entries[problem.id]
        score = dataset.score_answer(self.extract(completion_text), entry)
        return 1.0 if score >= 1.0 else 0.0

    def _eval_problems(self, eval_seed: int) -> list[Problem]:
        ds_seed = EVAL_SEED_BASE + eval_seed
        ds = self._dataset(ds_seed, self.n_eval)
        return [self._problem(f"{self.name}/eval/{ds_seed}/{i}", ds, ds[i]) for i in range(self.n_eval)]

    def _train_stream(self, seed: int) -> Iterator[Problem]:
        # Train items must not collide with the eval items of any eval seed in use; the fixed eval seed
        # (the default) is the one that matters, so that is the one checked.
        eval_problems = self.splits.eval(self.splits.eval_seed_for(seed))
        eval_questions = {self._entries[p.id][1]["question"] for p in eval_problems}
        mix = hashlib.blake2b(f"{self.seed}-{seed}".encode(), digest_size=4).digest()
        ds_seed = int.from_bytes(mix, "big")  # < 2**32, far below EVAL_SEED_BASE
        ds = self._dataset(ds_seed, self.size)
        overlap: set[int] = set()
        epoch = 0
        while True:
            order = list(range(self.size))
            random.Random(f"train-{seed}-{epoch}").shuffle(order)
            for i in order:
                if i in overlap:
                    continue
                entry = ds[i]
                if entry["question"] in eval_questions:
                    overlap.add(i)
                    self.n_overlap_skipped += 1
                    continue
                yield self._problem(f"{self.name}/train/{ds_seed}/{i}", ds, entry)
            if len(overlap) == self.size:
                raise ValueError(f"{self.name}: every train item equals an eval item; raise size or change config")
            epoch += 1
