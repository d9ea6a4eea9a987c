"""A hung engine (issue 26, item 2) is a fault like a dead one (issue 12, defect 4; one run here suffers both):
past ``engine.timeout_s`` without a rollout it is killed and restarted, its batches re-issued, with a fresh
deadline; an engine that keeps failing ends the run with one line and exit 2 (item 7), and the run resumes from
its checkpoint."""

import signal

from run_helpers import TINY, engine_signaller, read_jsonl, stable

# 2 hangs and 3 kills about three steps apart (run_helpers.engine_signaller), the last one 3 steps before the end
ARGS = ("steps=16", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=3")


def _cli(capfd, *args) -> tuple[int, list[str]]:
    """``satrl train *args`` in this process (the engine processes are its children, as under ``python -m satrl``):
    its exit code and its stderr lines but the restart notes, the engine children's included."""
    from satrl import cli

    capfd.readouterr()
    rc = cli.main(["train", *args, "--no-progress"])
    err = capfd.readouterr().err.splitlines()
    return rc, [x for x in err if x.strip() and not x.startswith("satrl: engine process")]


def test_killed_and_stopped_engines_are_restarted_and_lose_nothing(run_tiny, tiny_cfg, monkeypatch, trained_ids,
                                                                    capsys):  # fmt: skip
    """Issue 12's defect 4 and issue 26's item 2 in one run on the local backend: its engine process is SIGSTOPped
    twice and SIGKILLed three times (each a process not signalled before, with batches in flight, between and
    during generation); each dead or hung one (past engine.timeout_s, a fresh deadline each) is replaced and its
    batches re-issued: the samples trained and every metric equal the sequential run's."""
    from satrl.loop import orchestrator

    ref = run_tiny(*ARGS, name="ref")
    ref_ids = list(trained_ids)
    trained_ids.clear()
    made, make = [], orchestrator.make_backend
    monkeypatch.setattr(orchestrator, "make_backend", lambda *a, **k: made.append(make(*a, **k)) or made[-1])
    # the hangs first: a stop that caught a replacement still starting would wait engine.start_timeout_s
    kill, stop = signal.SIGKILL, signal.SIGSTOP
    on_step, hit = engine_signaller(made, (stop, stop, kill, kill, kill), 5)

    cfg = tiny_cfg(*ARGS, "backend=local", "engine.timeout_s=3", name="hit")
    capsys.readouterr()
    orchestrator.train(cfg, on_step=on_step)
    err = [x for x in capsys.readouterr().err.splitlines() if "hung" in x]
    assert len(set(hit)) == 5 and made[0].restarts == 5, (hit, err)  # each engine replaced after its kill or stop
    assert len(err) == 2 and all("engine.timeout_s" in x and "restarted" in x for x in err), err
    assert trained_ids == ref_ids, "samples lost, duplicated or reordered"
    assert stable(read_jsonl(cfg.run_dir() / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))


def _one_line_exit_2(rc: int, lines: list[str]) -> str:
    assert rc == 2 and len(lines) == 1, lines[-20:]
    return lines[0]


def test_engine_that_always_hangs_is_one_line_exit_2_and_retried(tmp_path, capfd, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("SATRL_FAULT", "worker.rollout")  # every engine stops on its 1st rollout
    monkeypatch.setenv("SATRL_FAULT_SIGNAL", "SIGSTOP")
    line = _one_line_exit_2(*_cli(capfd, *TINY, "steps=2", "backend=local", "engine.timeout_s=2",
                                  "engine.max_restarts=1", f"out={out}"))  # fmt: skip
    # it failed before its first step: nothing of it is left, and the same command runs again (issue 60)
    assert "hung" in line and "engine.timeout_s" in line and "run the same command again" in line, line
    assert not out.exists()
    monkeypatch.delenv("SATRL_FAULT")
    monkeypatch.delenv("SATRL_FAULT_SIGNAL")
    rc, lines = _cli(capfd, *TINY, "steps=2", "backend=local", f"out={out}")
    assert rc == 0, lines[-20:]


def test_engine_that_always_dies_is_one_line_exit_2(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SATRL_FAULT", "worker.rollout")
    line = _one_line_exit_2(*_cli(capfd, *TINY, "steps=2", "backend=local", "engine.max_restarts=1",
                                  f"out={tmp_path / 'run'}"))  # fmt: skip
    assert "died" in line and "giving up" in line, line
