"""Evaluate a policy on a task: avg@k (the paper's "AIME24 avg@8") and greedy accuracy.

For problems i = 1..N with k samples each and 0/1 rewards r_ij:

    avg@k       = 1/N sum_i ( 1/k sum_j r_ij )       mean over problems of the per-problem pass@1
    pass@k      = 1/N sum_i max_j r_ij               (recorded too; not the paper's headline)
    greedy_acc  = 1/N sum_i r_i(greedy)              one argmax decode per problem
    sampled entropy = sum_ijt -log mu(y_ijt) / sum_ij T_ij   nats per response token of the k samples

The last is a Monte Carlo estimate of the sampling distribution's entropy, averaged over the states the samples
visit (E_{y~mu}[-log mu(y)] = H(mu) at each step): from the log-probs the engine returns for the tokens it sampled,
so it needs nothing more of an engine and means the same on the torch engine and on vLLM.

Every request carries its own seed, derived from ``(seed, problem index, sample index)`` by a hash, so a
result does not depend on the batch size or on which requests share a batch (the engine guarantees the
rest). Prompts are encoded by :func:`satrl.models.chat.encode_prompt` with the run's ``model.chat`` settings
(default: ``tokenizer(prompt)["input_ids"]``, the tokenizer used as is; with ``template`` on, through its chat
template), exactly as the training pipeline encodes them.

Val and test. :func:`split_val_test` splits a task's eval problems by a fixed keyed hash of the prompt into
two disjoint parts, so that a training run can pick its best checkpoint on ``val`` and report it on
``test`` (docs/metrics.md, "Select on validation, report on test"). A problem's part never depends on the
seed, the order or how many problems are asked for.

CLI: ``satrl eval`` is :mod:`satrl.apps.eval`, a program above the layers (it reads run directories and the
launch settings); this module is the library it drives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

from satrl.models.chat import PLAIN, ChatFormat, encode_prompt
from satrl.types import Engine, GenerationRequest, Problem, SamplingParams, Task, prompt_text, request_seed

GREEDY = -1  # sample index of the greedy request in the seed derivation


@dataclass
class EvalResult:
    """Scores and the exact settings that produced them. ``per_problem`` holds the mean reward over the
    k samples of each problem, in problem order; ``greedy`` the greedy reward of each problem."""

    avg_at_k: float
    greedy_acc: float
    pass_at_k: float
    k: int
    n_problems: int
    sampling: dict[str, Any]
    task: str = ""
    split: str = "eval"
    seed: int = 0
    per_problem: list[float] = dataclasses.field(default_factory=list)
    greedy: list[float] = dataclasses.field(default_factory=list)
    hit: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: list[int] = dataclasses.field(default_factory=list)  # each problem's encoded prompt
    # per problem, over its k samples: the sum of -log mu of their response tokens, and how many tokens they have
    sampled_nll: list[float] = dataclasses.field(default_factory=list)
    sampled_tokens: list[int] = dataclasses.field(default_factory=list)

    @property
    def sampled_entropy(self) -> float:
        """Nats per sampled response token: the Monte Carlo estimate of the sampling distribution's entropy (module
        docstring); NaN without a sampled token."""
        n = sum(self.sampled_tokens)
        return sum(self.sampled_nll) / n if n else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """The scalar fields and the sampling settings (no per-problem lists), JSON-ready."""
        d = dataclasses.asdict(self)
        for name in ("per_problem", "greedy", "hit", "prompt_tokens", "sampled_nll", "sampled_tokens"):
            d.pop(name)
        return d


VAL_TEST_KEY = "satrl-val-test-v1"
PARTS = ("val", "test")


def part_of(problem: Problem, key: str = VAL_TEST_KEY) -> str:
    """``"val"`` or ``"test"``: the one part an eval problem belongs to, by a keyed blake2b hash of its prompt
    (half each in expectation; stable across processes, machines and Python versions)."""
    h = hashlib.blake2b(prompt_text(problem.prompt).encode(), digest_size=8, key=key.encode()).digest()
    return "val" if int.from_bytes(h, "big") >> 63 == 0 else "test"


def split_val_test(
    problems, val_problems: int, test_problems: int, key: str = VAL_TEST_KEY
) -> tuple[list[Problem], list[int], list[int]]:
    """Walk ``problems`` (an eval split, in order) and keep the first ``val_problems`` of the val part and the
    first ``test_problems`` of the test part. Returns ``(pool, val_idx, test_idx)``: the kept problems in
    their original order, and the positions in ``pool`` of each part. Raises ValueError naming the
    ``eval.*`` keys when the eval split is too small."""
    pool: list[Problem] = []
    idx: dict[str, list[int]] = {"val": [], "test": []}
    want = {"val": val_problems, "test": test_problems}
    seen = {"val": 0, "test": 0}
    for problem in problems:
        part = part_of(problem, key)
        seen[part] += 1
        if len(idx[part]) < want[part]:
            idx[part].append(len(pool))
            pool.append(problem)
        if all(len(idx[p]) == want[p] for p in PARTS):
            break
    short = [p for p in PARTS if len(idx[p]) < want[p]]
    if short:
        raise ValueError(
            f"the eval split has {seen['val']} val and {seen['test']} test problems, fewer than "
            f"eval.val_problems={val_problems} / eval.test_problems={test_problems}; lower them or give the task "
            "more eval problems (e.g. task.kwargs.n_eval for arithmetic)"
        )
    return pool, idx["val"], idx["test"]


def part_scores(result: EvalResult, idx: list[int]) -> dict[str, float]:
    """avg@k, greedy accuracy and pass@k of the problems at positions ``idx`` of an :class:`EvalResult`."""
    n = max(len(idx), 1)
    return {
        "avg_at_k": sum(result.per_problem[i] for i in idx) / n,
        "greedy_acc": sum(result.greedy[i] for i in idx) / n,
        "pass_at_k": sum(result.hit[i] for i in idx) / n,
    }


def _take(task: Task, split: str, n_problems: int | None) -> list[Problem]:
    if n_problems is None:
        if split != "eval":
            raise ValueError(f"split {split!r} may be an endless stream: give n_problems")
        return list(task.problems(split, 0))
    if n_problems < 1:
        raise ValueError(f"n_problems must be >= 1, got {n_problems}")
    problems = list(itertools.islice(task.problems(split, 0), n_problems))
    if len(problems) < n_problems:
        raise ValueError(f"task {task.name} has only {len(problems)} {split} problems, asked for {n_problems}")
    return problems


def _rewards(
    engine: Engine, task: Task, problems: list[Problem], requests: list[tuple[int, GenerationRequest]],
    sampling: SamplingParams, batch_size: int,
) -> tuple[list[float], list[float], list[int]]:
    """Generate ``requests`` (pairs of problem index and request) in batches: the reward of each, the sum of -log mu
    over its response tokens and their number."""
    out: tuple[list[float], list[float], list[int]] = ([], [], [])
    for start in range(0, len(requests), batch_size):
        chunk = requests[start : start + batch_size]
        completions = engine.generate([r for _, r in chunk], sampling)
        for (i, req), c in zip(chunk, completions, strict=True):
            if c.request_id != req.request_id:
                raise RuntimeError(f"engine answered {c.request_id!r} in place of {req.request_id!r}")
            out[0].append(task.reward(problems[i], c.text))
            out[1].append(-float(c.behavior_logp.double().sum()))
            out[2].append(len(c.response_ids))
    return out


def evaluate(
    engine: Engine,
    tokenizer: Any,
    task: Task,
    k: int = 8,
    split: str = "eval",
    n_problems: int | None = None,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    batch_size: int = 256,
    problems: list[Problem] | None = None,
    chat: ChatFormat = PLAIN,
) -> EvalResult:
    """avg@k with ``sampling`` (default: temperature 1, full support, 16 new tokens) and greedy
    accuracy (``sampling`` with ``greedy=True``) on the first ``n_problems`` problems of ``split``
    (all eval problems if None), or on ``problems`` when given; prompts encoded under ``chat``. See the module
    docstring for the formulas."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    sampling = sampling if sampling is not None else SamplingParams()
    if sampling.greedy:
        raise ValueError("sampling must not be greedy: avg@k needs sampled completions (greedy is scored too)")
    problems = _take(task, split, n_problems) if problems is None else list(problems)
    if not problems:
        raise ValueError("no problems to evaluate")
    ids = [encode_prompt(tokenizer, p.prompt, chat) for p in problems]

    sampled = [
        (i, GenerationRequest(f"{split}/{i}/{j}", ids[i], request_seed("eval", seed, i, j)))
        for i in range(len(problems))
        for j in range(k)
    ]
    r, nll, tokens = _rewards(engine, task, problems, sampled, sampling, batch_size)
    per_problem = [sum(r[i * k : (i + 1) * k]) / k for i in range(len(problems))]
    hit = [max(r[i * k : (i + 1) * k]) for i in range(len(problems))]

    greedy_sampling = dataclasses.replace(sampling, greedy=True)
    greedy_reqs = [
        (i, GenerationRequest(f"{split}/{i}/greedy", ids[i], request_seed("eval", seed, i, GREEDY)))
        for i in range(len(problems))
    ]
    greedy = _rewards(engine, task, problems, greedy_reqs, greedy_sampling, batch_size)[0]

    n = len(problems)
    return EvalResult(
        avg_at_k=sum(per_problem) / n,
        greedy_acc=sum(greedy) / n,
        pass_at_k=sum(hit) / n,
        k=k,
        n_problems=n,
        sampling=dataclasses.asdict(sampling),
        task=task.name,
        split=split,
        seed=seed,
        per_problem=per_problem,
        greedy=greedy,
        hit=hit,
        prompt_tokens=[len(x) for x in ids],
        sampled_nll=[sum(nll[i * k : (i + 1) * k]) for i in range(n)],
        sampled_tokens=[sum(tokens[i * k : (i + 1) * k]) for i in range(n)],
    )
