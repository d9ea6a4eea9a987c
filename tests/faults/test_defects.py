"""One test per defect of issue 12 (each failed before its fix): torn logs, NaN in metrics, resume without
a checkpoint, pickled checkpoints, bad data on both backends; an engine process that keeps dying, and a killed
one that is restarted: tests/faults/test_engine_hang.py."""

import json
import os
import pickle
import shutil

import pytest

from run_helpers import REPO, TINY, read_jsonl, stable
from satrl.jsonl import read_jsonl as tolerant_read

BAD_ROWS = '{"question": "1+1", "answer": "2"}\n{"question": 5}\nnot json\n'


def _strict_rows(path):
    def refuse(name):
        raise ValueError(f"bare {name} in {path}")

    return [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines() if x.strip()]


def _cli(capfd, *args) -> tuple[int, str]:
    """``satrl *args`` in this process (its exit code and stderr are what is checked, not a process of its own;
    capfd also takes the stderr of the engine processes it starts)."""
    from satrl import cli

    capfd.readouterr()
    rc = cli.main(list(args))
    return rc, capfd.readouterr().err


# -- defect 5: metrics.jsonl is strict JSON (null for undefined), old NaN files still read -------------
def test_metrics_are_strict_json(run_tiny):
    out = run_tiny("steps=2", "objective.name=grpo")  # GRPO logs gate/tv_lift, undefined without a gate
    rows = _strict_rows(out / "metrics.jsonl")
    assert any(r.get("gate/tv_lift", 0.0) is None for r in rows)
    assert all(r["reward/timeouts"] == 0.0 and r["perf/engine_restarts"] == 0.0 for r in rows)
    assert json.loads((out / "summary.json").read_text())["data/skipped_rows"] == 0
    _strict_rows(out / "eval.jsonl")
    json.loads((out / "summary.json").read_text(), parse_constant=lambda n: pytest.fail(f"bare {n} in summary"))


def test_old_files_with_bare_nan_still_read(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "x": NaN}\n{"step": 2, "x": 1.5}\n')
    rows = tolerant_read(p)
    assert rows[0]["x"] != rows[0]["x"] and rows[1]["x"] == 1.5


# -- defect 2: a torn last line does not break --resume --------------------------------------------
def test_resume_with_torn_last_metrics_line(run_tiny, shared_tiny):
    ref = shared_tiny("steps=4")
    out = run_tiny("steps=4", name="torn")
    (out / "summary.json").unlink()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/rew')  # the kill came mid-append
    run_tiny("steps=4", name="torn", resume=True)
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))


# -- defect 3: --resume of a run killed before its first checkpoint starts from step 0 ------------------
def test_resume_without_checkpoint_starts_from_zero(run_tiny, shared_tiny, capsys):
    ref = shared_tiny("steps=4")
    out = run_tiny("steps=4", name="early")
    (out / "summary.json").unlink()
    shutil.rmtree(out / "checkpoints")
    (out / "checkpoints" / ".step-000002.tmp").mkdir(parents=True)  # killed while writing the first one
    (out / "checkpoints" / ".step-000002.tmp" / "model.safetensors").write_bytes(b"\0" * 10)
    # no latest: it is written only after a checkpoint is complete (one naming a folder that is gone is damage,
    # refused: tests/training/test_checkpoint_manifest.py, "only checkpoint deleted")
    capsys.readouterr()
    run_tiny("steps=4", name="early", resume=True)
    err = capsys.readouterr().err
    assert "no complete checkpoint" in err and "step 0" in err
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(ref / "metrics.jsonl"))


def test_resume_of_a_dir_that_is_not_a_run(tmp_path, capfd):
    rc, err = _cli(capfd, "train", "--resume", str(tmp_path), "--no-progress")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and str(tmp_path) in err


# -- defect 6: checkpoints never unpickle --------------------------------------------------------------
class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_has_no_pickle_and_round_trips(shared_tiny):
    out = shared_tiny("steps=2")
    step = out / "checkpoints" / "step-000002"
    names = sorted(p.name for p in step.iterdir())
    assert not [n for n in names if n.endswith((".pt", ".pkl", ".bin"))], names
    for name in names:
        data = (step / name).read_bytes()
        assert not data.startswith(b"\x80"), f"{name} is a pickle"  # pickle protocol 2+ header


def test_planted_pickle_is_refused_not_executed(shared_tiny, tmp_path):
    from satrl.loop.orchestrator import train
    from satrl.rundir.files import RunDir

    out = shutil.copytree(shared_tiny("steps=2"), tmp_path / "run")
    (out / "summary.json").unlink()
    marker = tmp_path / "pwned"
    step = out / "checkpoints" / "step-000002"
    for f in step.iterdir():
        if f.name != "model.safetensors":
            f.unlink()
    (step / "state.pt").write_bytes(pickle.dumps({"run": _Evil(marker)}))
    with pytest.raises(Exception, match="pickle"):
        train(RunDir.config_of(str(out), []), resume=True)
    assert not marker.exists(), "loading the checkpoint executed code from it"


def test_model_path_never_runs_remote_code(tmp_path):
    """A policy directory whose config asks for custom code (auto_map) is refused; its code never runs."""
    from satrl.models import load_policy

    model = tmp_path / "evil-model"
    shutil.copytree(REPO / "src" / "satrl" / "models" / "checkpoints" / "tiny-arith", model)
    marker = tmp_path / "pwned"
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    config["model_type"] = "evil"
    (model / "config.json").write_text(json.dumps(config))
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(Exception, match="trust_remote_code|custom code|evil"):
        load_policy(str(model))
    assert not marker.exists(), "loading model.path executed the model directory's code"


# -- defect 1: bad data -> exit 2 and one line naming the file, on both backends -------------------------
@pytest.mark.parametrize("backend", ["local", "sequential"])
def test_bad_dataset_is_one_line_exit_2(tmp_path, backend, capfd):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(BAD_ROWS)
    rc, err = _cli(capfd, "train", str(REPO / "configs" / "grpo.yaml"), *TINY, "task.name=jsonl_math",
                   f"task.kwargs.path={bad}", "steps=2", f"backend={backend}", f"out={tmp_path / 'run'}",
                   "--no-progress")  # fmt: skip
    lines = [x for x in err.splitlines() if x.strip() and "Loading weights" not in x]
    assert rc == 2, err[-2000:]
    assert len(lines) == 1 and str(bad) in lines[0] and "line 1" in lines[0], lines


def test_local_backend_surfaces_a_failed_engine_child(tiny_cfg):
    """An engine child that dies at start-up is an error in the parent within seconds, never a hang."""
    from satrl.launch.setup import worker_spec
    from satrl.pipeline.engines_host.local_backends import ProcessBackend
    from satrl.pipeline.engines_host.worker import RolloutRequest

    spec = worker_spec(tiny_cfg("engine.kwargs={bogus: 1}"))
    backend = ProcessBackend(spec, timeout_s=60)
    backend.submit(RolloutRequest(0, [0] * 4))
    with pytest.raises(Exception, match="engine"):
        backend.result(0)
    backend.close()


# -- defect 4: a SIGKILLed engine process is restarted, its work re-issued, no sample lost or doubled: with the
# hung engines of issue 26 in one run, tests/faults/test_engine_hang.py::test_killed_and_stopped_engines_are_restarted;
# engines that keep failing end the run with one error line: test_engine_hang.py::test_engine_that_keeps_failing_...
