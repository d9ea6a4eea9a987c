import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satrl.tasks import ArithmeticOptions, ArithmeticTask, make_task
from satrl.types import Problem, Task

PROMPT_RE = re.compile(r"^(\d+)([+\-*])(\d+)=$")


def _parse(p: Problem) -> tuple[int, str, int]:
    m = PROMPT_RE.match(p.prompt)
    assert m is not None, p.prompt
    return int(m.group(1)), m.group(2), int(m.group(3))


def test_is_a_task_and_registry_builds_it():
    task = make_task("arithmetic", digits=2, ops=("+", "-"))
    assert isinstance(task, Task)
    assert isinstance(task, ArithmeticTask)
    assert task.digits == 2 and task.ops == ("+", "-")


def test_unknown_task_name_lists_choices():
    with pytest.raises(ValueError, match="arithmetic.*countdown.*jsonl_math"):
        make_task("arithmetc")


def test_prompt_zero_padded_and_answer_is_plain_integer():
    task = ArithmeticTask(ArithmeticOptions(digits=3, ops="+-*"))
    assert task.make_problem("x", 7, "+", 45).prompt == "007+045="
    assert task.make_problem("x", 7, "+", 45).answer == "52"
    assert task.make_problem("x", 7, "-", 45).answer == "-38"
    assert task.make_problem("x", 0, "*", 999).answer == "0"
    assert task.make_problem("x", 999, "*", 999).answer == "998001"


@given(
    digits=st.integers(1, 5),
    data=st.data(),
)
def test_answers_match_python_arithmetic(digits, data):
    a = data.draw(st.integers(0, 10**digits - 1))
    b = data.draw(st.integers(0, 10**digits - 1))
    op = data.draw(st.sampled_from(["+", "-", "*"]))
    task = ArithmeticTask(ArithmeticOptions(digits=digits, ops=(op,)))
    p = task.make_problem("x", a, op, b)
    assert len(p.prompt) == 2 * digits + 2
    assert _parse(p) == (a, op, b)
    assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
    assert p.answer == str(int(p.answer))  # no leading zeros, no plus sign
    assert task.reward(p, p.answer) == 1.0


@pytest.mark.parametrize(
    "text,expected",
    [("579", 1.0), (" 579", 0.0), ("579 ", 0.0), ("579\n", 0.0), ("0579", 0.0), ("+579", 0.0),
     ("579.0", 0.0), ("57", 0.0), ("5790", 0.0), ("", 0.0), ("579=", 0.0)],
)
def test_reward_is_strict(text, expected):
    task = ArithmeticTask()
    p = Problem(id="x", prompt="123+456=", answer="579")
    assert task.reward(p, text) == expected


def test_negative_answer_needs_the_minus_sign():
    task = ArithmeticTask(ArithmeticOptions(digits=1, ops="-", n_eval=3))
    p = task.make_problem("x", 3, "-", 8)
    assert task.reward(p, "-5") == 1.0
    assert task.reward(p, "5") == 0.0
    assert task.reward(p, "- 5") == 0.0


def test_splits_disjoint_over_the_full_space():
    # 2 digits, 3 ops: all 30,000 expressions. Each belongs to exactly one split, the eval split is drawn
    # only from the eval partition and a long train stream never hits it.
    task = ArithmeticTask(ArithmeticOptions(digits=2, ops="+-*", n_eval=500, n_train=20_000))
    space = [(a, op, b) for op in "+-*" for a in range(100) for b in range(100)]
    eval_part = {t for t in space if task.split_of(*t) == "eval"}
    assert 0.08 < len(eval_part) / len(space) < 0.12  # eval_fraction = 0.1
    for seed in range(3):
        ev = {_parse(p) for p in task.problems("eval", seed)}
        assert len(ev) == 500 and ev <= eval_part
        tr = {_parse(p) for p in task.problems("train", seed)}
        assert tr.isdisjoint(eval_part)
        assert len(tr) > 10_000  # the stream really covers the train partition


def test_splits_disjoint_on_a_large_sample_3_digits():
    task = ArithmeticTask(ArithmeticOptions(digits=3, ops="+-", n_eval=1000))
    ev = {_parse(p) for p in task.problems("eval", 0)}
    assert len(ev) == 1000
    tr = {_parse(p) for p in itertools.islice(task.problems("train", 0), 50_000)}
    assert tr.isdisjoint(ev)
    assert all(task.split_of(*t) == "eval" for t in ev)
    assert all(task.split_of(*t) == "train" for t in tr)


def test_deterministic_for_a_seed():
    t1, t2 = ArithmeticTask(ArithmeticOptions(digits=3)), ArithmeticTask(ArithmeticOptions(digits=3))
    a = list(itertools.islice(t1.problems("train", 7), 200))
    b = list(itertools.islice(t2.problems("train", 7), 200))
    c = list(itertools.islice(t2.problems("train", 8), 200))
    assert a == b
    assert [p.prompt for p in a] != [p.prompt for p in c]


def test_eval_same_for_every_seed_unless_asked():
    task = ArithmeticTask(ArithmeticOptions(digits=3))
    e0, e5 = list(task.problems("eval", 0)), list(task.problems("eval", 5))
    assert len(e0) == 200 and e0 == e5
    assert len({p.id for p in e0}) == 200
    free = ArithmeticTask(ArithmeticOptions(digits=3, eval_seed=None))
    assert [p.prompt for p in free.problems("eval", 0)] != [p.prompt for p in free.problems("eval", 5)]


def test_train_stream_is_endless_by_default_and_sized_on_request():
    task = ArithmeticTask(ArithmeticOptions(digits=1, ops="+", n_eval=5))
    assert len(list(itertools.islice(task.problems("train", 0), 5000))) == 5000
    assert len(list(ArithmeticTask(ArithmeticOptions(n_train=37)).problems("train", 0))) == 37


def test_large_digit_space_uses_sampling():
    task = ArithmeticTask(ArithmeticOptions(digits=6, ops="*", n_eval=50))
    ev = list(task.problems("eval", 0))
    assert len({p.prompt for p in ev}) == 50
    assert all(len(p.prompt) == 14 for p in ev)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"ops": ("/",)}, "ops"), ({"ops": ()}, "ops"), ({"digits": 0}, "digits"),
     ({"eval_fraction": 1.5}, "eval_fraction"), ({"n_eval": 0}, "n_eval"), ({"n_train": -1}, "n_train")],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(ArithmeticOptions(**kwargs))


def test_eval_larger_than_partition_is_a_clear_error():
    task = ArithmeticTask(ArithmeticOptions(digits=1, ops="+", n_eval=50))  # ~10 eval expressions exist
    with pytest.raises(ValueError, match="lower n_eval"):
        list(task.problems("eval", 0))


def test_unknown_split():
    with pytest.raises(ValueError, match="train.*eval"):
        ArithmeticTask().problems("test", 0)


def test_an_eval_draw_leaves_out_the_excluded_draws_and_only_them():
    """exclude_eval_seeds (at exclude_n_eval each): a large fresh draw shares no problem with the earlier trials'
    draws of 200 (without it, a draw of 4000 shares 3-12 with each), and is otherwise the plain draw in its order."""
    from satrl.tasks import make_task

    earlier = (0, 1000, 2026, 3000)
    kw = {"n_eval": 4000, "eval_seed": 5000}
    fresh = [p.prompt for p in make_task("arithmetic", **kw, exclude_eval_seeds=earlier, exclude_n_eval=200).problems("eval", 0)]
    plain = [p.prompt for p in make_task("arithmetic", **kw).problems("eval", 0)]
    seen = {p.prompt for s in earlier for p in make_task("arithmetic", eval_seed=s).problems("eval", 0)}
    assert len(set(fresh)) == 4000 and not set(fresh) & seen
    assert set(plain) & seen  # the exclusion is what keeps them apart
    assert [q for q in plain if q not in seen] == fresh[: len([q for q in plain if q not in seen])]
    with pytest.raises(ValueError, match="exclude_n_eval"):
        make_task("arithmetic", exclude_eval_seeds=[0], exclude_n_eval=0)
