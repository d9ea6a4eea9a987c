"""benchmarks/ci_time.py times what `.ci/run` runs, in its order, and reads pytest's summary lines."""

from benchmarks import ci_time


def test_its_targets_are_ci_runs():
    assert ci_time.ci_targets((ci_time.ROOT / ".ci" / "run").read_text()) == ci_time.TARGETS


def test_the_check_sees_another_target():
    assert ci_time.ci_targets("make test\nmake test-core\n") == ("test", "test-core")


def test_pytest_summaries_are_read_from_every_call():
    log = ("===== 1703 passed, 148 skipped, 106 warnings in 941.33s (0:15:41) =====\n"
           "===== 12 passed in 3.00s =====\n")  # fmt: skip
    assert ci_time.SUMMARY.findall(log) == ["1703 passed, 148 skipped, 106 warnings in 941.33s", "12 passed in 3.00s"]
