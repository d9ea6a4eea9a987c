"""countdown_trace: the solver's traces, the exact reward (and its agreement with reasoning-gym's scorer), the
disjoint splits, the trace lengths, the tokenizer's coverage, the registry, and the `satrl pretrain` recipes of its
base policy (256 positions, trained on solver traces, scored with the task's 240-token cap; arithmetic untouched)."""

from __future__ import annotations

import argparse
import itertools
import json
from itertools import islice
from pathlib import Path

import pytest

from satrl.apps.pretrain import add_pretrain_args, run_pretrain
from satrl.models import load_policy
from satrl.models.tokenizer import CHARS, build_char_tokenizer
from satrl.tasks import TASKS, TaskError, make_task
from satrl.tasks.countdown_solver import check_answer, evaluate, final_answer, solve
from satrl.tasks.countdown_trace import (
    CONTEXT,
    CountdownTraceOptions,
    CountdownTraceTask,
    length_stats,
    parse_prompt,
    prompt_of,
)
from satrl.training.pretrain import PretrainSettings, pretrain
from satrl.training.recipes import RECIPES
from satrl.types import Problem, Task

TASK = CountdownTraceTask()
CHECKPOINTS = Path(__file__).resolve().parents[2] / "src" / "satrl" / "models" / "checkpoints"


def _problem(numbers, target) -> Problem:
    return Problem(id="t", prompt=prompt_of(numbers, target), answer="")


# ------------------------------------------------------------------------------------------- the solver
def test_solver_writes_the_depth_first_trace_of_a_solvable_problem():
    trace = solve([25, 3, 2], 56)
    assert trace.text == "25+3=28: 30 26 28*2=56 ok. answer: (25+3)*2"
    assert trace.solved and trace.expression == "(25+3)*2"
    # a longer search: every node before the hit lists its leaf values (the module docstring's example)
    long = solve([13, 2, 14], 91)
    assert long.text == ("13+2=15: 29 1 210, 13-2=11: 25 3 154, 13*2=26: 40 12 364, 14+13=27: 29 25 54, "
                         "14-13=1: 3 1 2 2, 14*13=182: 184 180 364 182/2=91 ok. answer: (14*13)/2")  # fmt: skip


def test_solver_on_an_unsolvable_problem_searches_everything_and_answers_none():
    trace = solve([1, 1, 1], 50)
    assert not trace.solved and trace.expression is None
    assert trace.text.endswith(". answer: none")
    assert trace.text.count(":") == 3 * 4 + 1  # 3 pairs x 4 operators (1 divides 1), then "answer:"
    assert TASK.reward(_problem([1, 1, 1], 50), trace.text) == 0.0


def _natural_solvable(numbers, target) -> bool:
    """Brute force, written apart from the solver: some order and two operators reach the target with natural
    intermediates (what the solver searches)."""

    def results(a, b):
        out = [a + b, a * b] + ([a - b] if a >= b else []) + ([a // b] if b > 0 and a % b == 0 else [])
        return out

    for x, y, z in itertools.permutations(numbers):
        for r in results(x, y):
            if target in results(r, z) or target in results(z, r):
                return True
    return False


def test_solver_finds_a_solution_exactly_when_one_exists():
    for numbers in itertools.combinations_with_replacement(range(1, 8), 3):
        for target in range(1, 80):
            trace = solve(list(numbers), target)
            assert trace.solved == _natural_solvable(numbers, target), (numbers, target, trace.text)
            if trace.solved:
                assert check_answer(trace.expression, numbers, target), (numbers, target, trace.expression)


def test_every_problem_carries_its_solved_trace():
    for p in [*islice(TASK.problems("train", 3), 200), *TASK.problems("eval", 0)]:
        numbers, target = parse_prompt(p.prompt)
        assert len(numbers) == 3 and all(1 <= n <= 30 for n in numbers) and 10 <= target <= 99
        assert p.answer == solve(numbers, target).text
        assert TASK.reward(p, p.answer) == 1.0


# ------------------------------------------------------------------------------------------- the reward
@pytest.mark.parametrize("completion,expected", [
    ("25+3=28: 30 26 28*2=56 ok. answer: (25+3)*2", 1.0),  # the reference trace
    ("answer: (25+3)*2", 1.0),  # only the final answer is scored
    ("answer:  2 * ( 3 + 25 ) ", 1.0),  # another correct expression, spaces between tokens
    ("x. answer: 1+1, answer: (25+3)*2", 1.0),  # the last answer counts
    ("answer: (25+3)*2+2-2", 0.0),  # a number used twice
    ("answer: 25*2+3", 0.0),  # every number used, wrong value (53)
    ("answer: 28*2", 0.0),  # right value, not the given numbers
    ("answer: (25+3)*2 ok", 0.0),  # trailing text
    ("(25+3)*2", 0.0),  # no answer marker
    ("answer: none", 0.0),
    ("answer: ((25+3)*2", 0.0),
    ("answer: (25+3)*2)", 0.0),
    ("answer: 25+*3*2", 0.0),
    ("answer: ", 0.0),
    ("", 0.0),
])  # fmt: skip
def test_reward_is_exact(completion, expected):
    assert TASK.reward(_problem([25, 3, 2], 56), completion) == expected


def test_scorer_is_exact_arithmetic():
    assert evaluate("30/(26/13)")[0] == 15 and evaluate("1/3*3")[0] == 1  # real division, exact
    assert check_answer("7/(3-1/2)*5", [7, 3, 1, 2, 5], 14)  # a non-natural intermediate is fine for the scorer
    assert not check_answer("7/(3-3)", [7, 3, 3], 0)  # division by zero
    assert evaluate("03+1") is None and evaluate("1 2") is None and evaluate("2**3") is None
    assert final_answer("a answer: b answer:  c ") == "c" and final_answer("no marker") is None


def _rg_countdown():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    return reasoning_gym.create_dataset("countdown", size=1, seed=0)


def _expressions(numbers):
    """Every way to write three numbers with two operators: both bracketings and none."""
    for (x, y, z), o1, o2 in itertools.product(itertools.permutations(numbers), "+-*/", "+-*/"):
        yield from (f"({x}{o1}{y}){o2}{z}", f"{x}{o1}({y}{o2}{z})", f"{x}{o1}{y}{o2}{z}")


def test_reward_agrees_with_reasoning_gyms_scorer():
    rg = _rg_countdown()
    checked = hits = 0
    for p in islice(TASK.problems("eval", 0), 3):
        numbers, target = parse_prompt(p.prompt)
        entry = {"metadata": {"numbers": numbers, "target": target}}
        a, b, c = numbers
        malformed = ["", f"{a}+{b}", f"{a}+{b}+{c}+{a}", f"({a}+{b}", f"{a} {b}+{c}", f"{a}+{b}+{c})", "answer"]
        for expr in [*_expressions(numbers), *malformed, solve(numbers, target).expression]:
            ours = TASK.reward(p, f"answer: {expr}")
            assert ours == (1.0 if rg.score_answer(expr, entry) >= 1.0 else 0.0), (numbers, target, expr)
            checked, hits = checked + 1, hits + int(ours)
    assert checked > 800 and hits >= 3  # each problem's own answer at least


def test_scorer_is_stricter_than_reasoning_gym_off_the_rules():
    """What sympy evaluates but countdown does not allow: a power, a unary minus. reasoning-gym scores them 1."""
    rg = _rg_countdown()
    for numbers, target, expr in [([2, 3, 1], 9, "2**3+1"), ([5, 3, 10], 12, "-3+5+10")]:
        assert rg.score_answer(expr, {"metadata": {"numbers": numbers, "target": target}}) == 1.0
        assert TASK.reward(_problem(numbers, target), f"answer: {expr}") == 0.0


# ------------------------------------------------------------------------------------------- splits
def _key(p: Problem):
    numbers, target = parse_prompt(p.prompt)
    return tuple(sorted(numbers)), target


def _overlap(task, n_train=3000):
    eval_keys = {_key(p) for p in task.problems("eval", 0)}
    return eval_keys & {_key(p) for p in islice(task.problems("train", 0), n_train)}


def test_train_and_eval_are_disjoint():
    assert not _overlap(TASK)
    assert all(TASK.split_of(*parse_prompt(p.prompt)) == "eval" for p in TASK.problems("eval", 0))


def test_the_overlap_check_catches_a_leaky_split():
    class Leaky(CountdownTraceTask):
        def _next(self, rng, split):  # train drawn from the eval partition too
            return super()._next(rng, "eval")

    assert _overlap(Leaky(CountdownTraceOptions(n_eval=100)), n_train=500)


def test_eval_is_fixed_and_train_follows_the_seed():
    eval_problems = list(TASK.problems("eval", 0))
    assert len(eval_problems) == 256 and len({_key(p) for p in eval_problems}) == 256
    assert eval_problems == list(CountdownTraceTask().problems("eval", 7))  # eval_seed=0: the same for every seed
    other = CountdownTraceTask(CountdownTraceOptions(eval_seed=None))
    assert list(other.problems("eval", 1)) != list(other.problems("eval", 2))
    assert list(islice(TASK.problems("train", 1), 20)) == list(islice(CountdownTraceTask().problems("train", 1), 20))
    assert list(islice(TASK.problems("train", 1), 20)) != list(islice(TASK.problems("train", 2), 20))
    assert len(list(CountdownTraceTask(CountdownTraceOptions(n_train=5)).problems("train", 0))) == 5


@pytest.mark.parametrize("eval_seed", [0, 1, 2, 5])
def test_eval_split_holds_a_runs_default_val_and_test_parts(eval_seed):
    """eval.val_problems=80 and eval.test_problems=100 (the run defaults) fit, for eval.problem_seed values too
    (with 200 problems, seeds 2, 3 and 5 had fewer than 100 test problems)."""
    from satrl.tasks.evaluate import split_val_test

    _, val, test = split_val_test(CountdownTraceTask(CountdownTraceOptions(eval_seed=eval_seed)).problems("eval", 0), 80, 100)
    assert (len(val), len(test)) == (80, 100)


# ------------------------------------------------------------------------------------------- lengths and tokens
def test_traces_are_long_and_fit_the_context():
    stats = length_stats(CountdownTraceTask(), n=300)
    assert stats["trace"]["mean"] >= 4 * stats["arithmetic_response"]["mean"]
    assert stats["trace"]["median"] >= 4 * stats["arithmetic_response"]["median"]
    assert stats["total"]["p95"] <= CONTEXT and stats["total"]["max"] <= CONTEXT
    assert TASK.max_new_tokens == 240 and stats["prompt"]["max"] + TASK.max_new_tokens <= CONTEXT


def test_the_trace_budget_drops_long_draws():
    short = CountdownTraceTask(CountdownTraceOptions(max_trace_tokens=60))
    assert all(len(p.answer) + 1 <= 60 for p in islice(short.problems("train", 0), 100))
    assert short.n_rejected["too_long"] > 0


def test_char_tokenizer_covers_prompts_and_traces():
    tok = build_char_tokenizer(CONTEXT)
    for p in [*islice(TASK.problems("train", 0), 300), *TASK.problems("eval", 0)]:
        text = p.prompt + p.answer
        assert set(text) <= set(CHARS), set(text) - set(CHARS)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids and len(ids) == len(text)
        assert tok.decode(ids) == text


@pytest.mark.parametrize("name", ["tiny-arith", "tiny-arith-moe"])
def test_token_ids_are_those_the_shipped_checkpoints_use(name):
    """The char tokenizer was not extended for countdown: its ids equal the shipped arithmetic bases' ids."""
    shipped = json.loads((CHECKPOINTS / name / "tokenizer.json").read_text())["model"]["vocab"]
    assert build_char_tokenizer().get_vocab() == shipped
    assert len(shipped) == 52


# ------------------------------------------------------------------------------------------- registry
def test_registry_builds_it_with_its_config():
    task = make_task("countdown_trace", max_value=12, n_eval=20)
    assert isinstance(task, CountdownTraceTask) and isinstance(task, Task)
    assert "countdown_trace" in TASKS.names() and task.values == (1, 12)
    assert all(max(parse_prompt(p.prompt)[0]) <= 12 for p in task.problems("eval", 0))
    with pytest.raises(TaskError, match="countdown_trace"):
        make_task("countdown_trace", digits=3)  # an argument it does not take
    with pytest.raises(TaskError, match="min_numbers"):
        make_task("countdown_trace", min_numbers=1)


def test_a_run_config_resolves_the_task():
    from satrl.config import load_config

    cfg = load_config(None, ["task.name=countdown_trace", "task.kwargs.max_value=20", "engine.max_new_tokens=240"])
    assert cfg.task.name == "countdown_trace" and cfg.task.kwargs == {"max_value": 20}
    assert make_task(cfg.task.name, **cfg.task_kwargs).values == (1, 20)


# ------------------------------------------------------------------------------------------- the base's recipes
def _parse(argv):
    parser = argparse.ArgumentParser()
    add_pretrain_args(parser)
    return parser.parse_args(argv)


def test_recipes_give_the_countdown_bases_a_long_context_and_leave_arithmetic_alone():
    for name, kind in [("tiny-countdown", "dense"), ("tiny-countdown-moe", "moe")]:
        recipe = RECIPES.get(name)
        assert recipe["task"] == "countdown_trace" and recipe["kind"] == kind
        assert recipe["model_cfg"] == {"max_position_embeddings": CONTEXT}
    assert all("model_cfg" not in RECIPES.get(name) for name in ("tiny-arith", "tiny-arith-moe"))


def test_the_recipe_runs_from_the_cli_and_records_itself(tmp_path, capsys):
    out = tmp_path / "base"
    argv = ["--model", "tiny-countdown-moe", "--steps", "2", "--batch-size", "2", "--threads", "1",
            "--final-eval-problems", "0", "--out", str(out), "--no-progress"]  # fmt: skip
    assert run_pretrain(_parse(argv)) == 0
    assert "2 steps" in capsys.readouterr().out
    record = json.loads((out / "pretrain.json").read_text())
    assert record["command"] == (f"satrl pretrain --model tiny-countdown-moe --steps 2 --seed 0 --batch-size 2 "
                                 f"--threads 1 --final-eval-problems 0 --out {out}")  # fmt: skip
    assert record["args"]["task"] == "countdown_trace" and record["args"]["kind"] == "moe"
    assert record["args"]["model_cfg"] == {"max_position_embeddings": CONTEXT}
    model, tok = load_policy(out)
    assert model.config.max_position_embeddings == CONTEXT and tok.model_max_length == CONTEXT
    assert model.config.num_experts == 8 and len(tok) == 52


def test_arithmetic_pretraining_keeps_its_64_positions(tmp_path):
    out = tmp_path / "arith"
    argv = ["--steps", "1", "--batch-size", "2", "--threads", "1", "--final-eval-problems", "0", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert run_pretrain(_parse(argv)) == 0
    model, tok = load_policy(out)
    assert model.config.max_position_embeddings == 64 and tok.model_max_length == 64
    assert json.loads((out / "pretrain.json").read_text())["args"]["model_cfg"] == {}


def test_traces_are_learned_and_scored_with_the_tasks_cap():
    """A few steps lower the loss on traces; the periodic and the final score run through the engine with the
    task's max_new_tokens (240), not the sampler's 8 or evaluate's 16."""
    cfg = {"max_position_embeddings": CONTEXT, "num_hidden_layers": 1}  # one layer: fast
    settings = PretrainSettings("dense", task="countdown_trace", steps=6, batch_size=8, warmup=1, threads=1,
                                eval_every=3, eval_problems=1, eval_k=1, final_eval_problems=1, model_cfg=cfg)  # fmt: skip
    record = pretrain(settings, progress=False)
    first = pretrain(PretrainSettings("dense", task="countdown_trace", steps=1, batch_size=8, threads=1,
                                      final_eval_problems=0, model_cfg=cfg), progress=False)  # fmt: skip
    assert record["final_loss"] < 0.9 * first["final_loss"]
    assert [h["step"] for h in record["history"]] == [3, 6]
    assert all(h["n_problems"] == 1 and h["k"] == 1 for h in record["history"])
    assert record["final"]["sampling"]["max_new_tokens"] == 240
    assert record["final"]["task"].startswith("countdown_trace(")


def _keys(task, seed=0):
    return {(tuple(sorted(n)), t) for n, t in (parse_prompt(p.prompt) for p in task.problems("eval", seed))}


def test_an_eval_draw_leaves_out_the_draws_it_excludes():
    """Two eval draws share 5-13 % of their problems (the eval split is small); ``exclude_eval_seeds`` makes a
    trial's draw share none with the draws named (the base's pretraining score is draw 0), and changes nothing of
    a draw that excludes nothing."""
    plain = {s: _keys(make_task("countdown_trace", eval_seed=s)) for s in (0, 6000, 6001)}
    assert plain[6001] & (plain[0] | plain[6000])  # without the option the draws overlap: the test can fail
    later = make_task("countdown_trace", eval_seed=6001, exclude_eval_seeds=[0, 6000])
    kept = _keys(later)
    assert len(kept) == later.n_eval and not kept & (plain[0] | plain[6000])
    assert len(kept & plain[6001]) >= later.n_eval // 2  # the rest of its own draw, in its order
    assert _keys(make_task("countdown_trace", eval_seed=6001, exclude_eval_seeds=[])) == plain[6001]


def test_chained_exclusions_leave_out_what_an_excluding_draw_held():
    """A draw that excluded another holds problems beyond its plain draw's (the calibration's draw 6000 excluding 0);
    a later draw that lists both plain draws may meet them (draw 7000 does, in 4 problems), one that chains the
    exclusions meets none of them nor draw 0's, and keeps its own draw's order otherwise."""
    calibration = _keys(make_task("countdown_trace", eval_seed=6000, exclude_eval_seeds=[0]))
    first = _keys(make_task("countdown_trace", eval_seed=0))
    unchained = _keys(make_task("countdown_trace", eval_seed=7000, exclude_eval_seeds=[0, 6000]))
    assert unchained & calibration  # the plain exclusion misses the calibration's extra problems: the test can fail
    task = make_task("countdown_trace", eval_seed=7000, exclude_eval_seeds=[0, 6000], chain_exclusions=True)
    kept = _keys(task)
    assert len(kept) == task.n_eval and not kept & (calibration | first)
    assert len(kept & unchained) >= task.n_eval - 10
