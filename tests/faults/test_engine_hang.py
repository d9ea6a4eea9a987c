"""A hung engine (issue 26, item 2) is a fault like a dead one (issue 12, defect 4; one run here suffers both):
past ``engine.timeout_s`` without a rollout it is killed and restarted, its batches re-issued, with a fresh
deadline; an engine that keeps failing ends the run with one line and exit 2 (item 7), and the run resumes from
its checkpoint."""

import signal

from run_helpers import TINY, engine_signaller, read_jsonl, stable

# A hang, then a kill three steps later (run_helpers.engine_signaller), the last one 6 steps before the end: 2 faults,
# more than engine.max_restarts (1), so the run also shows that a result resets the count in a row
ARGS = ("steps=10", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=3")
NOTE = "satrl: engine process"  # how each restart note starts


def _cli(capfd, *args) -> tuple[int, list[str]]:
    """``satrl train *args`` in this process (the engine processes are its children, as under ``python -m satrl``):
    its exit code and its non-blank stderr lines, the engine children's included."""
    from satrl import cli

    capfd.readouterr()
    rc = cli.main(["train", *args, "--no-progress"])
    return rc, [x for x in capfd.readouterr().err.splitlines() if x.strip()]


def test_killed_and_stopped_engines_are_restarted_and_lose_nothing(run_tiny, tiny_cfg, monkeypatch, trained_ids,
                                                                    capsys):  # fmt: skip
    """Issue 12's defect 4 and issue 26's item 2 in one run on the local backend: its engine process is SIGSTOPped
    and then SIGKILLed (each a process not signalled before, with batches in flight, between or during
    generation); each dead or hung one (past engine.timeout_s, a fresh deadline each) is replaced and its batches
    re-issued: the samples trained and every metric equal the sequential run's."""
    from satrl.loop import orchestrator

    ref = run_tiny(*ARGS, name="ref")
    ref_ids = list(trained_ids)
    trained_ids.clear()
    made, make = [], orchestrator.make_backend
    monkeypatch.setattr(orchestrator, "make_backend", lambda *a, **k: made.append(make(*a, **k)) or made[-1])
    # the hang first: a stop that caught a replacement still starting would wait engine.start_timeout_s
    on_step, hit = engine_signaller(made, (signal.SIGSTOP, signal.SIGKILL), 2)

    cfg = tiny_cfg(*ARGS, "backend=local", "engine.timeout_s=3", "engine.max_restarts=1", name="hit")
    capsys.readouterr()
    orchestrator.train(cfg, on_step=on_step)
    err = [x for x in capsys.readouterr().err.splitlines() if "hung" in x]
    assert len(set(hit)) == 2 and made[0].restarts == 2, (hit, err)  # each engine replaced after its kill or stop
    assert len(err) == 1 and all("engine.timeout_s" in x and "restarted" in x for x in err), err
    assert trained_ids == ref_ids, "samples lost, duplicated or reordered"
    assert stable(read_jsonl(cfg.run_dir() / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))


def test_engine_that_keeps_failing_is_one_line_exit_2_and_retried(tmp_path, capfd, monkeypatch):
    """Every engine fails on its first rollout (engine.max_restarts=1): the first dies (SIGKILL), is restarted
    (a note), and its replacement hangs (SIGSTOP): past engine.timeout_s it is the second fault in a row, and the run
    ends with one line and exit 2 that names the last one (the same line for an engine that always dies, but for
    its cause). The run failed before its first step: nothing of it is left, and the same command runs again."""
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setenv("SATRL_FAULT", "worker.rollout")  # every engine child signals itself on its first rollout
        m.setenv("SATRL_FAULT_SIGNAL", "SIGKILL,SIGSTOP")  # the first child dies, the next ones hang (faults.spawned)
        rc, lines = _cli(capfd, *TINY, "steps=2", "backend=local", "engine.timeout_s=2", "engine.max_restarts=1",
                         f"out={out}")  # fmt: skip
    notes, rest = [x for x in lines if x.startswith(NOTE)], [x for x in lines if not x.startswith(NOTE)]
    assert rc == 2 and len(rest) == 1, lines[-20:]
    assert len(notes) == 1 and "died: exit code -9" in notes[0] and "restarted it (1/1)" in notes[0], notes
    line = rest[0]
    assert "failed 2 times in a row" in line and "giving up" in line, line
    assert "hung" in line and "engine.timeout_s" in line and "run the same command again" in line, line
    assert not out.exists()
    rc, lines = _cli(capfd, *TINY, "steps=2", "backend=local", f"out={out}")
    assert rc == 0, lines[-20:]
