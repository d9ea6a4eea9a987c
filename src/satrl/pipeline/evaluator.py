"""The evaluator: avg@k and greedy accuracy of the trainer's current weights on the val and test problems.

Its own engine (built on first use) with the rollout engine's numerics; the loop calls it when :meth:`Evaluator.due`
and hands the result to the run directory (``eval.jsonl``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from satrl import faults
from satrl.models.chat import PLAIN, ChatFormat
from satrl.types import SamplingParams, TrainerLike


@dataclass(frozen=True)
class EvalEngineSpec:
    """How to build the evaluation engine (:func:`satrl.engines.registry.engine_for`): its registry ``name``, its
    extra ``kwargs`` (``eval.engine_kwargs``), the policy's ``model_path`` and the rollout engine's ``numerics``."""

    name: str
    kwargs: dict[str, Any]
    model_path: str
    numerics: str


@dataclass(frozen=True)
class EvalPlan:
    """What each evaluation scores and when (the ``eval`` section).

    Attributes:
        sampling, k, seed: sampling settings, samples per problem, the run seed (request seeds derive from it).
        every, at_start: evaluate every this many optimizer steps (0: only at the end), and at step 0.
        val_problems, test_problems: problems of each part per evaluation.
        late_test_problems, late_from: test problems of the evaluations at steps >= ``late_from`` (the endpoint's
            late window), a superset of the others' (None: the same ``test_problems`` throughout).
        chat: how prompts become token ids (``model.chat``), as the rollouts encode them.
    """

    sampling: SamplingParams
    k: int
    seed: int
    every: int
    at_start: bool
    val_problems: int
    test_problems: int
    late_test_problems: int | None = None
    late_from: int | None = None
    chat: ChatFormat = PLAIN

    def is_late(self, step: int) -> bool:
        return self.late_test_problems is not None and self.late_from is not None and step >= self.late_from


class Evaluator:
    """avg@k and greedy accuracy of the trainer's current weights, with the engine's numerics, on the
    val and test parts of the eval problems (one generation pass over both; scores per part and pooled).
    :func:`satrl.launch.setup.build_evaluator` builds it from the config.

    Args:
        tokenizer, task: the run's tokenizer and task (its ``eval`` split is scored).
        engine: how to build the evaluation engine, on first use.
        plan: what is scored and when.
    """

    def __init__(self, tokenizer, task, engine: EvalEngineSpec, plan: EvalPlan) -> None:
        self.tokenizer, self.task, self.engine = tokenizer, task, None
        self.spec, self.plan = engine, plan

    def due(self, step: int, last: int) -> bool:
        if step == 0:
            return self.plan.at_start
        every = self.plan.every
        return step == last or (every > 0 and step % every == 0)

    def prepare(self) -> None:
        """Choose the val and test problems (once). Called before training, so that an eval split too small
        for ``eval.*`` fails at once with a one-line TaskError, not at the first evaluation."""
        from satrl.tasks import TaskError
        from satrl.tasks.evaluate import split_val_test

        if hasattr(self, "pool"):
            return
        plan, sizes = self.plan, {False: self.plan.test_problems}
        if plan.late_test_problems is not None:
            sizes[True] = plan.late_test_problems
        self.parts = {}
        for late, n in sizes.items():  # the first test_problems of the test part are the same problems in both
            try:
                self.parts[late] = split_val_test(self.task.problems("eval", 0), plan.val_problems, n)
            except ValueError as err:
                why = str(err).replace("eval.test_problems", "eval.late_test_problems") if late else str(err)
                raise TaskError(why) from None
        # the largest draw: every problem any evaluation prompts with (the context check reads it)
        self.pool = self.parts[max(sizes, key=sizes.get)][0]

    def __call__(self, trainer: TrainerLike) -> dict:
        from satrl.engines.registry import engine_for
        from satrl.tasks.evaluate import evaluate, part_scores

        faults.point("eval.start")
        if self.engine is None:
            spec = self.spec
            self.engine = engine_for(spec.name, self.tokenizer, model=trainer.export.engine_model(),
                                     model_path=spec.model_path, numerics=spec.numerics, **spec.kwargs)  # fmt: skip
            self.prepare()
        self.engine.load_weights(trainer.export.weights(), trainer.version)
        pool, val_idx, test_idx = self.parts[self.plan.is_late(trainer.version)]
        res = evaluate(
            self.engine, self.tokenizer, self.task, k=self.plan.k, sampling=self.plan.sampling, seed=self.plan.seed,
            problems=pool, chat=self.plan.chat,
        )
        out = {"avg_at_k": res.avg_at_k, "greedy_acc": res.greedy_acc, "k": res.k}
        if self.plan.chat.template:  # the rendered prompts' mean length (eval.jsonl is as before without it)
            out["prompt_tokens"] = sum(res.prompt_tokens) / len(res.prompt_tokens)
        for part, idx in (("val", val_idx), ("test", test_idx)):
            if idx:
                out.update({f"{part}_{k}": v for k, v in part_scores(res, idx).items()})
                out[f"{part}_n"] = len(idx)
        return out
