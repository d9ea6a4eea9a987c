"""Hostile model outputs: the math verifier returns in bounded time, a timeout is reward 0 and is counted."""

import threading
import time

import pytest

from satrl.tasks.jsonl_math import JsonlMathOptions, JsonlMathTask

HOSTILE = {
    "tower": "\\boxed{9^9^9^9}",
    "bare tower": "9^9^9^9",
    "nested parens": "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
    "1 MB": "1+" * 500_000 + "1",
    "NUL": "\x00",
    "boxed NUL": "\\boxed{\x00}",
    "huge factorial": "\\boxed{99999999!}",
}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "set.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n')
    return JsonlMathTask(JsonlMathOptions(path, verify_timeout_s=1))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_answer_is_graded_in_bounded_time(task, name):
    (problem,) = task.problems("eval")
    t0 = time.perf_counter()
    reward = task.reward(problem, HOSTILE[name])
    assert reward == 0.0
    assert time.perf_counter() - t0 < 2 * task.verify_timeout_s + 1.5, "grading ran past its time limit"


def test_timeout_is_counted_and_right_answers_still_score(task):
    (problem,) = task.problems("eval")
    before = task.timeouts
    assert task.reward(problem, "9^9^9^9") == 0.0
    assert task.timeouts == before + 1
    assert task.reward(problem, "x" * 50_000 + " so the answer is \\boxed{2}") == 1.0
    assert task.timeouts == before + 1


def test_grading_in_a_thread_never_hangs(task):
    """Off the main thread there is no SIGALRM; the length cap still bounds the work on huge inputs."""
    (problem,) = task.problems("eval")
    out = []
    t = threading.Thread(target=lambda: out.append(task.reward(problem, "x" * 1_000_000 + "\\boxed{2}")), daemon=True)
    t.start()
    t.join(timeout=30)
    assert out == [1.0]


# -- issue 26, item 9: hostile gold answers ------------------------------------------------------------
def test_skipped_row_warning_shows_a_short_preview_of_a_long_answer(tmp_path):
    """A skipped row's reason quotes at most a preview of its answer (a 1 MB log line before)."""
    import json
    import warnings

    path = tmp_path / "long.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n' + json.dumps({"problem": "x", "answer": "\\boxed{" + "@" * 500_000}) + "\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t = JsonlMathTask(JsonlMathOptions(path, verify_timeout_s=1))
    assert len(t.skipped) == 1 and "500,007 characters" in t.skipped[0][1]
    (w,) = [str(x.message) for x in seen]
    assert "line 2" in w and len(w) < 400 and "\n" not in w, w[:500]


@pytest.mark.parametrize("gold", ["10^{10^{10}}", "99999999!"])
def test_gold_whose_grading_always_times_out_is_skipped_at_load(tmp_path, gold):
    """Such a gold made every sample of its problem time out (reward 0, 9x slower run); now a skipped row."""
    import json
    import warnings

    path = tmp_path / "slow.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n' + json.dumps({"problem": "big?", "answer": gold}) + "\n")
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t = JsonlMathTask(JsonlMathOptions(path, verify_timeout_s=1))
    assert time.perf_counter() - t0 < 2 * t.verify_timeout_s + 3
    assert [n for n, _ in t.skipped] == [2] and "time limit" in t.skipped[0][1], t.skipped
    assert [p.answer for p in t.problems("eval")] == ["2"]
    assert len(seen) == 1 and "time limit" in str(seen[0].message)
