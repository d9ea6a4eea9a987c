import importlib.util
import itertools
import json
import threading

import pytest

from satrl.tasks import make_task
from satrl.tasks.jsonl_math import JsonlMathOptions, JsonlMathTask
from satrl.types import Problem, Task

ROWS = [
    {"problem": "What is 1/2 as a decimal?", "answer": "0.5"},
    {"problem": "Compute 3/6.", "answer": "\\frac{1}{2}"},
    {"problem": "What is 6*7?", "answer": 42},
    {"problem": "Area of a circle with radius sqrt(3)?", "answer": "3\\pi"},
]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def _good_file(tmp_path, rows=ROWS, name="set.jsonl"):
    return _write(tmp_path / name, [json.dumps(r) for r in rows])


def test_loads_and_formats_prompts(tmp_path):
    task = make_task("jsonl_math", path=str(_good_file(tmp_path)), prompt_template="Q: {problem}\nA:")
    assert isinstance(task, Task)
    probs = list(task.problems("eval", 0))
    assert [p.prompt for p in probs][:1] == ["Q: What is 1/2 as a decimal?\nA:"]
    assert [p.answer for p in probs] == ["0.5", "\\frac{1}{2}", "42", "3\\pi"]
    assert [p.id for p in probs] == ["set:1", "set:2", "set:3", "set:4"]
    assert task.skipped == []


@pytest.mark.parametrize(
    "row,text,expected",
    [
        (1, "so it is \\boxed{0.5}", 1.0),  # gold \frac{1}{2}, written differently
        (1, "The answer is $\\frac12$", 1.0),
        (0, "\\boxed{\\frac{1}{2}}", 1.0),  # gold 0.5
        (0, "\\boxed{0.25}", 0.0),
        (2, "6*7 = \\boxed{42}", 1.0),
        (2, "\\boxed{41}", 0.0),
        (3, "\\boxed{3\\pi}", 1.0),
        (3, "\\boxed{3}", 0.0),  # a bare '3\pi' gold would wrongly parse as 3
        (0, "I do not know", 0.0),
        (0, "", 0.0),
    ],
)
def test_math_verify_reward(tmp_path, row, text, expected):
    task = JsonlMathTask(JsonlMathOptions(_good_file(tmp_path)))
    p = list(task.problems("eval", 0))[row]
    assert task.reward(p, text) == expected


def test_reward_for_a_problem_built_elsewhere(tmp_path):
    task = JsonlMathTask(JsonlMathOptions(_good_file(tmp_path)))
    assert task.reward(Problem(id="other", prompt="?", answer="\\frac{3}{4}"), "\\boxed{0.75}") == 1.0


def test_reward_works_off_the_main_thread(tmp_path):
    # math-verify's timeout uses SIGALRM, which fails outside the main thread; the task must not.
    task = JsonlMathTask(JsonlMathOptions(_good_file(tmp_path)))
    p = list(task.problems("eval", 0))[1]
    out = []
    t = threading.Thread(target=lambda: out.append(task.reward(p, "\\boxed{0.5}")))
    t.start()
    t.join()
    assert out == [1.0]


def test_malformed_rows_are_counted_with_line_numbers(tmp_path):
    lines = [
        json.dumps(ROWS[0]),  # 1 ok
        "{not json",  # 2 bad JSON
        json.dumps({"problem": "no answer"}),  # 3 missing answer
        json.dumps({"problem": "  ", "answer": "1"}),  # 4 empty problem
        json.dumps([1, 2]),  # 5 not an object
        "",  # 6 blank: not a row
        json.dumps({"problem": "p", "answer": None}),  # 7 null answer
        json.dumps({"problem": "p", "answer": "$$"}),  # 8 unparseable gold
        json.dumps(ROWS[2]),  # 9 ok
    ]
    with pytest.warns(UserWarning, match="skipped 6 malformed rows"):
        task = JsonlMathTask(JsonlMathOptions(_write(tmp_path / "bad.jsonl", lines)))
    assert [n for n, _ in task.skipped] == [2, 3, 4, 5, 7, 8]
    reasons = dict(task.skipped)
    assert "bad JSON" in reasons[2] and "'answer'" in reasons[3] and "'problem'" in reasons[4]
    assert "not a JSON object" in reasons[5] and "not parseable" in reasons[8]
    assert [p.id for p in task.problems("eval", 0)] == ["bad:1", "bad:9"]
    assert "kept 2 rows" in task.report() and "line 2: bad JSON" in task.report()


def test_custom_keys(tmp_path):
    path = _good_file(tmp_path, [{"question": "1+1?", "solution": "2"}])
    task = JsonlMathTask(JsonlMathOptions(path, problem_key="question", answer_key="solution", prompt_template="{problem}"))
    (p,) = task.problems("eval", 0)
    assert p.prompt == "1+1?" and task.reward(p, "\\boxed{2}") == 1.0


def test_no_usable_rows_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"no usable rows.*line 1: bad JSON.*line 2: missing"):
        JsonlMathTask(JsonlMathOptions(_write(tmp_path / "x.jsonl", ["{bad", json.dumps({"q": 1})])))


def test_split_fraction_is_deterministic_and_disjoint(tmp_path):
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(200)]
    path = _good_file(tmp_path, rows)
    t1, t2 = JsonlMathTask(JsonlMathOptions(path, eval_fraction=0.25)), JsonlMathTask(JsonlMathOptions(path, eval_fraction=0.25))
    ev = [p.id for p in t1.problems("eval", 0)]
    assert ev == [p.id for p in t2.problems("eval", 3)]
    assert 30 < len(ev) < 70
    train_ids = {p.id for p in itertools.islice(t1.problems("train", 0), 400)}
    assert train_ids.isdisjoint(ev) and len(train_ids) + len(ev) == 200
    # endless, reshuffled per epoch, deterministic per seed
    a = [p.id for p in itertools.islice(t1.problems("train", 0), 2 * (200 - len(ev)))]
    n = 200 - len(ev)
    assert sorted(a[:n]) == sorted(a[n:]) and a[:n] != a[n:]
    assert a == [p.id for p in itertools.islice(t2.problems("train", 0), 2 * n)]
    assert a != [p.id for p in itertools.islice(t2.problems("train", 1), 2 * n)]


def test_all_eval_by_default_and_train_is_a_clear_error(tmp_path):
    task = JsonlMathTask(JsonlMathOptions(_good_file(tmp_path)))
    assert len(list(task.problems("eval", 0))) == 4
    with pytest.raises(ValueError, match="no train rows"):
        task.problems("train", 0)


def test_missing_file_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        JsonlMathTask(JsonlMathOptions(tmp_path / "nope.jsonl"))
    path = _good_file(tmp_path)
    with pytest.raises(ValueError, match="problem"):
        JsonlMathTask(JsonlMathOptions(path, prompt_template="no field"))
    with pytest.raises(ValueError, match="eval_fraction"):
        JsonlMathTask(JsonlMathOptions(path, eval_fraction=2.0))
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match="parquet"):
        JsonlMathTask(JsonlMathOptions(csv))


def test_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "set.parquet"
    if importlib.util.find_spec("pyarrow") is None:
        path.write_bytes(b"PAR1")  # never read: the missing dependency is reported first
        with pytest.raises(ImportError, match="pip install pyarrow"):
            JsonlMathTask(JsonlMathOptions(path))
        return
    pd.DataFrame([{"problem": "1+1?", "answer": "2"}, {"problem": "x", "answer": None}]).to_parquet(path)
    with pytest.warns(UserWarning, match="skipped 1"):
        task = JsonlMathTask(JsonlMathOptions(path))
    (p,) = task.problems("eval", 0)
    assert task.reward(p, "\\boxed{2}") == 1.0
