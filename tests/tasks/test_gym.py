import itertools

import pytest

from satrl.tasks import make_task
from satrl.tasks.gym import ReasoningGymTask
from satrl.types import Problem, Task

pytest.importorskip("reasoning_gym")


@pytest.fixture(scope="module")
def countdown():
    return make_task("countdown", size=30, n_eval=10)


def test_countdown_registry_and_protocol(countdown):
    assert isinstance(countdown, Task) and isinstance(countdown, ReasoningGymTask)
    assert countdown.name == "gym:countdown"
    probs = list(countdown.problems("eval", 0))
    assert len(probs) == 10 and len({p.id for p in probs}) == 10
    assert all("numbers" in p.prompt and p.answer for p in probs)


def test_countdown_reward_thresholds_partial_credit(countdown):
    p = next(countdown.problems("eval", 0))
    assert countdown.reward(p, p.answer) == 1.0  # the reference expression
    dataset, entry = countdown._entries[p.id]
    # a well-formed wrong expression gets partial credit from reasoning-gym, 0 here
    assert 0 < dataset.score_answer("1+2", entry) < 1
    assert countdown.reward(p, "1+2") == 0.0
    assert countdown.reward(p, "") == 0.0


def test_countdown_accepts_another_correct_expression(countdown):
    # a different string with the same value and the same numbers: reasoning-gym evaluates, not string-matches
    for p in countdown.problems("eval", 0):
        assert countdown.reward(p, f"({p.answer})") == 1.0
        assert countdown.reward(p, f"({p.answer})+1") == 0.0


def test_answer_tag_extraction():
    task = ReasoningGymTask.from_kwargs("countdown", size=5, n_eval=3, extract="answer_tag")
    p = next(task.problems("eval", 0))
    assert task.reward(p, f"<think>try</think><answer>{p.answer}</answer>") == 1.0
    assert task.reward(p, p.answer) == 0.0  # no tag, nothing to score
    custom = ReasoningGymTask.from_kwargs("countdown", size=5, n_eval=3, extract=lambda s: s.split("|")[-1])
    q = next(custom.problems("eval", 0))
    assert custom.reward(q, f"junk|{q.answer}") == 1.0


def test_gym_prefix_with_config():
    task = make_task("gym:basic_arithmetic", size=20, n_eval=5, min_terms=2, max_terms=2)
    p = next(task.problems("eval", 0))
    assert task.name == "gym:basic_arithmetic"
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, p.answer + "1") == 0.0


def test_eval_fixed_train_deterministic_and_disjoint():
    task = ReasoningGymTask.from_kwargs("basic_arithmetic", size=40, n_eval=40, min_terms=2, max_terms=2, max_digits=1)
    ev = list(task.problems("eval", 0))
    assert ev == list(task.problems("eval", 7))  # same eval for every seed
    eval_q = {p.prompt for p in ev}
    a = list(itertools.islice(task.problems("train", 0), 100))  # crosses an epoch
    b = list(itertools.islice(ReasoningGymTask.from_kwargs(
        "basic_arithmetic", size=40, n_eval=40, min_terms=2, max_terms=2, max_digits=1
    ).problems("train", 0), 100))
    assert [p.id for p in a] == [p.id for p in b]
    assert {p.prompt for p in a}.isdisjoint(eval_q)
    # with 1-digit sums the space is tiny, so overlaps really happen and are skipped
    assert task.n_overlap_skipped > 0
    c = list(itertools.islice(task.problems("train", 1), 30))
    assert [p.prompt for p in c] != [p.prompt for p in a[:30]]


def test_bad_names_and_config():
    with pytest.raises(ValueError, match="valid choices.*countdown"):
        make_task("gym:countdwn")
    with pytest.raises(ValueError, match="unknown countdown config.*min_numbers"):
        make_task("countdown", bogus=3)
    with pytest.raises(ValueError, match="answer_tag"):
        ReasoningGymTask.from_kwargs("countdown", extract="xml")
    with pytest.raises(ValueError, match=r"unknown split 'test'; valid choices: \['train', 'eval'\]"):  # every task's
        ReasoningGymTask.from_kwargs("countdown", size=2, n_eval=2).problems("test", 0)


def test_foreign_problem_is_an_error(countdown):
    with pytest.raises(ValueError, match="only score problems it produced"):
        countdown.reward(Problem(id="x", prompt="?", answer="1"), "1")


def test_last_number_extraction_scores_a_chat_models_prose_answer():
    from satrl.tasks.gym import EXTRACTORS

    last = EXTRACTORS.get("last_number")
    assert last("The answer is 578.") == "578"
    assert last("12 + 7 = 19, so the total is -1,234.5 apples") == "-1234.5"
    assert last("no digits here") is None and last("") is None
    task = ReasoningGymTask.from_kwargs("basic_arithmetic", size=5, n_eval=3, extract="last_number")
    p = next(task.problems("eval", 0))
    assert task.reward(p, f"Let me think. The answer is {p.answer}.") == 1.0
    assert task.reward(p, f"The answer is {p.answer}1.") == 0.0
