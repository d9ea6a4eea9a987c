"""One test per run-folder defect of issue 26 (each failed before its fix): a damaged metrics line inside the
log (1), extending a finished run (3), out= an ordinary folder (6), two processes in one run folder (9); and of
issue 46, item 2: a finished run that lost its metrics.jsonl replaced by a fresh one."""

import fcntl
import os
from types import SimpleNamespace

import pytest

from run_helpers import TINY, read_jsonl, stable
from satrl.loop.orchestrator import train
from satrl.rundir.files import RunDir, RunDirError

LAGGED = ("lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=5")


def _cli(capfd, *args) -> SimpleNamespace:
    """``satrl train *args`` in this process (what these tests check is the command's exit code, its stderr and
    the folder it leaves, not a process of its own: a fresh interpreter would cost seconds of imports each time):
    its ``returncode`` and ``stderr``, as :func:`subprocess.run` gives them. The lock test's flock is on an open
    file of its own, which a flock of this process's command on its own open of the file conflicts with."""
    from satrl import cli

    capfd.readouterr()
    rc = cli.main(["train", *args, "--no-progress"])
    return SimpleNamespace(returncode=rc, stderr=capfd.readouterr().err)


def _one_line(r, code: int = 2) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code and len(lines) == 1, r.stderr[-3000:]
    return lines[0]


# -- 1: a line damaged inside metrics.jsonl stops the resume; summary.json never comes from a gappy log ------
@pytest.mark.parametrize("damage", ["cut", "deleted"])
def test_damaged_metrics_line_stops_resume(run_tiny, damage):
    out = run_tiny("steps=4", name=damage)
    (out / "summary.json").unlink()
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:30] + "\n" if damage == "cut" else ""
    (out / "metrics.jsonl").write_text("".join(lines))
    before = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(RunDirError, match=r"metrics\.jsonl:2: ") as err:
        run_tiny("steps=4", name=damage, resume=True)
    assert "resum" in str(err.value) or "restore" in str(err.value)  # says how to go on
    assert (out / "metrics.jsonl").read_bytes() == before and not (out / "summary.json").exists()


def test_damaged_line_is_one_line_exit_2(run_tiny, capfd):
    out = run_tiny("steps=2")
    (out / "summary.json").unlink()
    text = (out / "eval.jsonl").read_text()
    (out / "eval.jsonl").write_text('{"step": 0, "avg_at\n' + text)  # damage in eval.jsonl, not at its end
    line = _one_line(_cli(capfd, "--resume", str(out)))
    assert f"{out / 'eval.jsonl'}:1:" in line and "satrl train: " in line


def test_torn_last_line_is_dropped_with_a_warning(run_tiny, shared_tiny, capsys):
    ref = shared_tiny("steps=4")
    out = run_tiny("steps=4", name="torn")
    (out / "summary.json").unlink()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/rew')  # the kill came mid-append
    capsys.readouterr()
    run_tiny("steps=4", name="torn", resume=True)
    assert f"{out / 'metrics.jsonl'}:5: torn last line" in capsys.readouterr().err
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))


def test_summary_refuses_a_gappy_log(run_tiny, tiny_cfg):
    out = run_tiny("steps=2")
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text(lines[1])  # step 1 gone
    run = RunDir(out, tiny_cfg("steps=2").model_dump(mode="json"), collapse=tiny_cfg().collapse, warmup_steps=2,
                 resume=True)  # fmt: skip
    try:
        with pytest.raises(RunDirError, match=r"metrics\.jsonl:1: step 2 where step 1 belongs"):
            run.finish(2)
    finally:
        run.release()


# -- 3: extending a finished run ----------------------------------------------------------------------
def test_extend_finished_run_equals_a_longer_run(run_tiny, shared_tiny):
    ref = shared_tiny("steps=6", *LAGGED)
    out = run_tiny("steps=4", *LAGGED, name="ext")
    train(RunDir.config_of(out, ["steps=6"]), resume=True)
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, 7))
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))
    assert "steps: 6" in (out / "config.yaml").read_text()


def test_refused_extension_leaves_config_yaml(run_tiny, capfd):
    out = run_tiny("steps=3", *LAGGED)  # 2 optimizer steps per batch: the run ends inside its second batch
    config = (out / "config.yaml").read_text()
    line = _one_line(_cli(capfd, "--resume", str(out), "steps=6"))
    assert "steps=6" in line and "resume with steps=3" in line
    assert (out / "config.yaml").read_text() == config
    assert _cli(capfd, "--resume", str(out)).returncode == 0  # a plain resume still works


def test_extension_without_the_weights_it_needs_is_refused(run_tiny, monkeypatch):
    """A run made before its last checkpoint kept the weights of later batches: one line, config.yaml kept."""
    from satrl.loop import orchestrator

    versions = orchestrator._versions
    monkeypatch.setattr(orchestrator, "_versions", lambda sched, b, P, *rest: versions(sched, b, P, *rest) if b < 2 else set())
    out = run_tiny("steps=4", *LAGGED)
    monkeypatch.setattr(orchestrator, "_versions", versions)
    config = (out / "config.yaml").read_text()
    with pytest.raises(RunDirError, match=r"steps=6: the weights of version\(s\) \[2\] .* resume with steps=4"):
        train(RunDir.config_of(out, ["steps=6"]), resume=True)
    assert (out / "config.yaml").read_text() == config
    train(RunDir.config_of(out), resume=True)  # a plain resume still works


# -- 6: out= an ordinary folder -----------------------------------------------------------------------------
@pytest.mark.parametrize("files", [{"notes.txt": "mine"}, {"config.yaml": "steps: 3\n", "summary.json": "{}"}])
def test_out_is_an_ordinary_folder(tmp_path, files, capfd):
    for name, text in files.items():
        (tmp_path / "mine" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "mine" / name).write_text(text)
    line = _one_line(_cli(capfd, "steps=2", f"out={tmp_path / 'mine'}"))
    assert f"out={tmp_path / 'mine'}" in line and "choose another out=" in line
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == sorted(files)
    assert all((tmp_path / "mine" / n).read_text() == t for n, t in files.items())


def test_out_folder_the_grid_runner_prepared_is_reused(tiny_cfg):
    """What the grid runner leaves before it starts a run (its stdout.log, an old error.txt) and the lock file
    of a killed process hold no run: a fresh run writes there."""
    out = tiny_cfg("steps=2").run_dir()
    out.mkdir(parents=True)
    (out / "stdout.log").write_text("=== satrl grid ...\n")
    (out / "error.txt").write_text("exit code -9\n")
    (out / ".satrl.lock").write_text("999999\n")  # its holder was killed: the kernel dropped the flock
    train(tiny_cfg("steps=2"))
    assert len(read_jsonl(out / "metrics.jsonl")) == 2


# -- issue 46, item 2: any file of a run makes the folder a run, which a fresh run never replaces -------------
def _tree(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("gone", [("metrics.jsonl",), ("metrics.jsonl", "eval.jsonl", "summary.json"),
                                  ("metrics.jsonl", "config.yaml")])  # fmt: skip
def test_a_run_missing_some_files_is_never_replaced(run_tiny, capsys, gone):
    from satrl import cli

    out = run_tiny("steps=2")
    for name in gone:
        (out / name).unlink()
    before = _tree(out)  # checkpoints, the other logs, config.yaml: all to lose
    capsys.readouterr()
    rc = cli.main(["train", *TINY, "steps=2", "seed=8", f"out={out}", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(out) in err[0] and "checkpoints" in err[0]  # names the folder and what it holds
    assert ("--resume" in err[0]) == ("config.yaml" not in gone)  # resumable only with its config.yaml
    assert _tree(out) == before  # byte-identical, and no lock file left behind


# -- 9: one process per run folder ----------------------------------------------------------------------
def test_run_folder_is_locked_while_training(run_tiny, capfd):
    out = run_tiny("steps=2")
    assert not (out / ".satrl.lock").exists()  # a clean exit removes its lock file
    (out / "summary.json").unlink()
    with open(out / ".satrl.lock", "a+") as held:  # another process trains in it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("424242\n")
        held.flush()
        line = _one_line(_cli(capfd, "--resume", str(out)))
        assert "424242" in line and str(out) in line
        assert not (out / "summary.json").exists()
    assert _cli(capfd, "--resume", str(out)).returncode == 0  # released (or its holder killed): no stale lock
    assert (out / "summary.json").exists() and not (out / ".satrl.lock").exists()


def test_a_lock_file_unlinked_under_a_waiting_opener_is_not_a_lock(tmp_path, monkeypatch):
    """A clean release unlinks the lock file while holding it; a process that opened the old file just before
    must not count its flock on that orphan as holding the folder: it locks the file now at the path."""
    from satrl import folders
    from satrl.rundir import files as rundir

    real_open, opened = open, []

    def racing_open(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        if not opened:  # the holder releases between this process's open and its flock
            os.unlink(path)
        opened.append(f)
        return f

    monkeypatch.setattr(folders, "open", racing_open, raising=False)
    held = rundir._lock(tmp_path)
    assert len(opened) == 2 and opened[0].closed and held is opened[1]
    assert os.stat(tmp_path / ".satrl.lock").st_ino == os.fstat(held.fileno()).st_ino
    held.close()
