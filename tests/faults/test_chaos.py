"""The chaos run of benchmarks/chaos.py at test size: >= 10 seeded kill points (replay a failure with
SATRL_CHAOS_SEED=<seed>), each run resumed until it ends and compared with an uninterrupted one. Prints the kill part
of the summary line docs/benchmarks.md ("Chaos") quotes.

The benchmark's other parts are checked case by case elsewhere, with the same cases and the same checks or stronger
ones, so this test does not run them again: hostile datasets and configs (benchmarks.hostile's lists) in
tests/faults/test_hostile.py, damaged checkpoints in tests/faults/test_bad_input_exit2.py, killed and hung engines in
tests/faults/test_engine_hang.py::test_killed_and_stopped_engines_are_restarted_and_lose_nothing (two kills and
two hangs in one run, the trained sample ids and metrics equal a sequential run's).

Each run of a chain is a process of its own, SIGKILLed from inside or outside, forked from a process that has
imported satrl once (run_helpers.ForkedCli) rather than a new `python -m satrl`: the process and its kill are the
same, and the chain of ~15 runs does not pay ~15 imports of torch (`python -m benchmarks.chaos` still launches
each with `python -m satrl`)."""

import os

from benchmarks.chaos import kill_anywhere, summary_line, train_args

from run_helpers import ForkedCli


def test_chaos_kill_points(tmp_path, capsys):
    seed = int(os.environ.get("SATRL_CHAOS_SEED", "0"))

    def launch(out, fault):
        return ForkedCli(train_args(out), {"SATRL_FAULT": fault}, tmp_path / "stderr.txt")

    try:
        kill = kill_anywhere(tmp_path / "kill", points=10, seed=seed, launch=launch)
    finally:
        ForkedCli.stop_server()
    line = summary_line(kill)
    with capsys.disabled():
        print(f"\n{line} (seed {seed})")
    assert kill["tried"] >= 10 and kill["identical"] == kill["tried"], line
