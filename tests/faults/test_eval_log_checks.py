"""Issue 46, item 4 (each failed before its fix): a damaged ``eval.jsonl`` was accepted on ``--resume``. Cut
mid-line, emptied, deleted or with a row removed, the resume exited 0, never redid the evaluations before the
checkpoint and changed ``best_step``, ``best_test_avg_at_k`` and ``eval_base``. Each checkpoint now records the
steps evaluated so far; a log that does not hold exactly those rows is refused: exit 2, one line naming
eval.jsonl:LINE (or the missing evaluation's step), the folder byte-identical."""

import shutil

import pytest

from run_helpers import TINY, folder_tree, read_jsonl, refused_resume, resume_lines, stable
from satrl.config import load_config
from satrl.loop.orchestrator import train
from satrl.rundir.files import RunDir

RUN = ("steps=4", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=7", "eval.every=2")

_tree, _resume, _refused = folder_tree, resume_lines, refused_resume


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step tiny run evaluated at steps 0, 2 and 4 (checkpoints at steps 2 and 4)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train(load_config(None, [*TINY, *RUN, f"out={out}"]))
    assert [r["step"] for r in read_jsonl(out / "eval.jsonl")] == [0, 2, 4]
    return out


@pytest.fixture
def copy(finished, tmp_path):
    def make(name="run"):
        out = tmp_path / name
        shutil.copytree(finished, out)
        return out

    return make


def _lines(out) -> list[str]:
    return (out / "eval.jsonl").read_text().splitlines(keepends=True)


# -- the four damages, on a finished run and on one killed after its checkpoint --------------------------
def _cut(out):  # the file cut inside its last row: that row looks like a kill mid-append
    text = (out / "eval.jsonl").read_text()
    (out / "eval.jsonl").write_text(text[: len(text) - len(_lines(out)[-1]) + 25])


def _emptied(out):
    (out / "eval.jsonl").write_text("")


def _deleted(out):
    (out / "eval.jsonl").unlink()


def _middle_removed(out):
    (out / "eval.jsonl").write_text("".join(_lines(out)[::2]))  # steps 0 and 4


DAMAGE = {  # how, and what the refusal says after the log's path
    "cut mid-line": (_cut, ":3: a line cut off where the evaluation at step 4 belongs"),
    "emptied": (_emptied, ": the log is empty, but the checkpoint at step 4 records an evaluation at step 0"),
    "deleted": (
        _deleted,
        ": the log is missing, but the checkpoint at step 4 records an evaluation at step 0",
    ),
    "middle row removed": (_middle_removed, ":2: step 4 where the evaluation at step 2 belongs"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_eval_log_of_a_finished_run_is_refused(copy, damage):
    out = copy()
    hurt, says = DAMAGE[damage]
    hurt(out)
    line = _refused(out)
    assert line.startswith("satrl train: ") and f"{out / 'eval.jsonl'}{says}" in line, line
    assert "restore the log" in line  # says how to go on


@pytest.mark.parametrize("damage", ["cut mid-line", "middle row removed"])
def test_damaged_eval_log_of_an_extended_run_is_refused(copy, damage):
    """The same damage with ``steps=<more>`` on the command line: nothing rewritten, config.yaml included."""
    out = copy()
    DAMAGE[damage][0](out)
    assert "eval.jsonl:" in _refused(out, "steps=6")


def test_killed_run_checks_only_what_its_checkpoint_records(tmp_path):
    """Killed after step 3 (checkpoint at step 2): a torn eval row written after the checkpoint is a kill
    mid-append, dropped with a warning, and the run completes as the unbroken one; the checkpointed step-2 row
    removed from a copy of the same folder is refused."""
    ref = tmp_path / "ref"
    train(load_config(None, [*TINY, *RUN, f"out={ref}"]))
    cfg = load_config(None, [*TINY, *RUN, f"out={tmp_path / 'killed'}"])

    def die(step, metrics, result):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=die)
    out = cfg.run_dir()
    with open(out / "eval.jsonl", "a") as f:
        f.write('{"step": 4, "avg_at')  # the kill came while the step-4 evaluation was appended
    gap = tmp_path / "gap"
    shutil.copytree(out, gap)
    (gap / "eval.jsonl").write_text("".join(_lines(gap)[:1] + _lines(gap)[2:]))  # the step-2 row gone
    line = _refused(gap)
    assert f"{gap / 'eval.jsonl'}:2: a line cut off where the evaluation at step 2 belongs" in line

    rc, lines = _resume(out)
    assert rc == 0 and any(f"{out / 'eval.jsonl'}:3: torn last line" in x for x in lines), lines
    assert stable(read_jsonl(out / "eval.jsonl")) == stable(read_jsonl(ref / "eval.jsonl"))


def test_schedule_changed_on_resume_is_followed(copy):
    """``eval.every`` may change on resume: the record follows the evaluations actually made, not today's
    schedule. A run evaluated at 0, 2, 4 and extended with eval.every=3 evaluates at 6 (and not at 4, whose
    end-of-run evaluation goes); resumed again, that log passes, and the same log without its step-2 row does not."""
    out = copy()
    train(RunDir.config_of(out, ["steps=6", "eval.every=3"]), resume=True)
    assert [r["step"] for r in read_jsonl(out / "eval.jsonl")] == [0, 2, 6]
    gap = out.parent / "gap"
    shutil.copytree(out, gap)
    (gap / "eval.jsonl").write_text("".join(_lines(gap)[::2]))  # steps 0 and 6
    assert f"{gap / 'eval.jsonl'}:2: step 6 where the evaluation at step 2 belongs" in _refused(gap)
    rc, lines = _resume(out)  # a finished run resumed as it is: checks pass, the summary is written again
    assert rc == 0 and not lines, lines
    assert [r["step"] for r in read_jsonl(out / "eval.jsonl")] == [0, 2, 6]


def test_checkpoint_from_before_the_record_needs_rising_steps(copy, monkeypatch):
    """A checkpoint written before the record (no ``evals`` in its run state) resumes on an intact log; a row
    repeated is refused."""
    load = RunDir.load

    def old(self):
        loaded = load(self)
        loaded.run.evals = None
        return loaded

    monkeypatch.setattr(RunDir, "load", old)
    out = copy()
    lines = _lines(out)
    (out / "eval.jsonl").write_text("".join([lines[0], lines[1], lines[1], lines[2]]))
    assert f"{out / 'eval.jsonl'}:3: step 2 after step 2" in _refused(out)
    (out / "eval.jsonl").write_text("".join(lines))
    rc, errs = _resume(out)
    assert rc == 0 and not errs, errs
    assert [r["step"] for r in read_jsonl(out / "eval.jsonl")] == [0, 2, 4]
