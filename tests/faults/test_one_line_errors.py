"""Issue 46, items 7-9: inputs that hung, ended in a traceback, or were taken without a word, and now end in one
line naming the key, flag or file, with exit status 2 (130 for Ctrl-C, naming the resume command). Each case
failed before its fix. Config values are checked in-process (``load_config``: the CLI turns every ConfigError into
one line and exit 2, tests/test_cli.py); flags and what the CLI itself checks go through ``cli.main``."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from run_helpers import REPO, TINY
from satrl import cli
from satrl.config import ConfigError, load_config


def _one_line(capsys, *argv: str, rc: int = 2) -> str:
    """Run ``satrl ARGV`` in this process: exit status ``rc`` and one line on stderr, no traceback; that line."""
    capsys.readouterr()
    got = cli.main(list(argv))
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert got == rc and len(err) == 1 and "Traceback" not in err[0], (got, err)
    return err[0]


def _refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    msg = str(err.value)
    assert msg and "\n" not in msg
    return msg


@pytest.fixture
def rows(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(20))
    )
    return data


# --- item 7: a size that cannot fit, refused before anything is allocated -------------------------------------
@pytest.mark.parametrize("overrides", [["train.prompts_per_batch=1000000000"],
                                       ["train.prompts_per_batch=100000", "train.group_size=100"],
                                       ["train.group_size=1000000000"]], ids=["prompts", "product", "group"])  # fmt: skip
def test_a_batch_that_cannot_fit_is_refused(overrides):
    msg = _refused(overrides)
    assert overrides[-1].split("=")[0] in msg or "train.prompts_per_batch" in msg, msg
    load_config(None, ["train.prompts_per_batch=1024", "train.group_size=1024"])  # the bound itself loads


# --- item 8: config values that ended in a traceback --------------------------------------------------------------
CONFIGS = [
    (["train.device=meta"], "train.device"),
    (["train.device=bogus"], "train.device"),
    (["seed=9223372036854775807"], "seed"),  # was documented valid; the range is now [0, 2^32)
    (["objective.trust_region.eps_high=1e308"], "trust_region.eps_high"),
    (["objective.trust_region.dual_clip=1e308"], "trust_region.dual_clip"),
]


@pytest.mark.parametrize("overrides,named", CONFIGS, ids=[c[0][0] for c in CONFIGS])
def test_a_config_value_that_broke_the_run_is_one_line(overrides, named):
    assert named in _refused(overrides)


BEFORE_RUN = [
    (["r3=true"], "r3=true"),  # the dense built-in policy: a ValueError from the trainer's setup
    (["engine.kwargs.foo=1"], "engine.kwargs.foo"),  # 97 lines of TypeError at the first evaluation
    (["engine.kwargs.device=bogus"], "engine.kwargs.device"),
    (["eval.engine_kwargs={foo: 1}"], "eval.engine_kwargs.foo"),
    (["eval.engine_kwargs={device: meta}"], "eval.engine_kwargs.device"),
]


@pytest.mark.parametrize("overrides,named", BEFORE_RUN, ids=[c[0][0] for c in BEFORE_RUN])
def test_what_satrl_train_checks_before_a_run_is_one_line(overrides, named):
    """The torch engines' arguments are checked when a run starts, not when a config loads (a config with
    another engine's arguments stays loadable, e.g. to inspect it)."""
    from satrl.config import check_before_run

    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError) as err:
        check_before_run(cfg)
    assert named in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_unknown_engine_argument_is_one_line_from_the_cli(tmp_path, capsys):
    line = _one_line(
        capsys, "train", *TINY, "steps=1", "engine.kwargs.foo=1", f"out={tmp_path / 'run'}", "--no-progress"
    )
    assert "engine.kwargs.foo" in line and "max_batch_size" in line, line
    assert not (tmp_path / "run").exists()


def test_what_those_checks_let_through_loads():
    from satrl.config import check_before_run

    cfg = load_config(None, ["r3=true", "model.name=tiny-arith-moe", "train.device=cuda:1", "seed=4294967295",
                             "engine.kwargs={device: cpu, max_batch_size: 4}", "objective.trust_region.eps_high=1e30"])  # fmt: skip
    check_before_run(cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": "cpu"})}))
    assert cfg.r3 and cfg.seed == 2**32 - 1 and cfg.engine.kwargs["max_batch_size"] == 4
    with pytest.raises(ConfigError, match="seed"):
        load_config(None, ["seed=4294967296"])


def test_the_largest_documented_seed_trains(run_tiny):
    """seed=2^63-1 was documented valid and overflowed a derived seed at the first step; the documented range is
    now [0, 2^32), and its last seed trains."""
    run = run_tiny("steps=1", "eval.at_start=false", f"seed={2**32 - 1}")
    assert (run / "summary.json").is_file()


@pytest.mark.parametrize("fraction", [1, 0, 1.0])
def test_a_jsonl_task_without_a_train_or_eval_split_is_refused(rows, fraction):
    """eval_fraction=1 leaves no train row: the engine process raised it, mid-run, in a traceback."""
    msg = _refused(["task=jsonl_math", f"task.kwargs.path={rows}", f"task.kwargs.eval_fraction={fraction}"])
    assert f"task.kwargs.eval_fraction={fraction}" in msg, msg
    load_config(None, ["task=jsonl_math", f"task.kwargs.path={rows}", "task.kwargs.eval_fraction=0.5"])


def test_an_empty_split_met_anyway_is_one_line(rows, tmp_path, capsys):
    """jsonl_math's default eval_fraction (1.0: every row eval, for satrl eval) is loadable; the run meets the
    empty train split when it asks for its first batch: a TaskError, one line (the engine process raised it)."""
    line = _one_line(capsys, "train", *TINY, "steps=1", "eval.at_start=false", "task=jsonl_math",
                     f"task.kwargs.path={rows}", 'task.kwargs.prompt_template="{problem}"', f"out={tmp_path / 'run'}",
                     "--no-progress")  # fmt: skip
    assert "no train rows" in line and "eval_fraction" in line, line


@pytest.mark.parametrize("template", ["{problem} {x}", "{problem} {}", "{problem} {"])
def test_a_prompt_template_with_another_field_is_one_line(rows, tmp_path, capsys, template):
    line = _one_line(capsys, "train", *TINY, "steps=1", "task=jsonl_math", f"task.kwargs.path={rows}",
                     "task.kwargs.eval_fraction=0.5", f"task.kwargs.prompt_template={json.dumps(template)}",
                     f"out={tmp_path / 'run'}", "--no-progress")  # fmt: skip
    assert "prompt_template" in line, line


def test_cuda_on_a_machine_without_it_is_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _one_line(
        capsys, "train", *TINY, "steps=1", "train.device=cuda", f"out={tmp_path / 'run'}", "--no-progress"
    )
    assert "train.device=cuda" in line and "no CUDA device" in line, line
    assert not (tmp_path / "run").exists()


def test_a_file_size_limit_is_one_line_naming_the_file(tmp_path, capsys):
    """``ulimit -f`` below a checkpoint's size: safetensors' SafetensorError (exit 1) before; now one line naming
    the checkpoint being written, exit 2 (Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    out = tmp_path / "run"
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**21, hard))  # 2 MiB: the tiny model's weights are larger
    try:
        line = _one_line(
            capsys, "train", *TINY, "steps=1", "eval.at_start=false", f"out={out}", "--no-progress"
        )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert "File too large" in line and f"{out / 'checkpoints' / 'step-'}" in line, line
    assert f"--resume {out}" in line, line


# --- item 8: flags of satrl grid, report and eval ----------------------------------------------------------------
GRID = str(REPO / "configs" / "grids" / "ci_smoke.yaml")


@pytest.mark.parametrize("flags,named", [(["--seeds", "0"], "--seeds 0"), (["--seeds", "-2"], "--seeds -2"),
                                         (["--workers", "0"], "--workers 0"), (["--threads", "-1"], "--threads -1")],
                         ids=["seeds0", "seeds-2", "workers0", "threads-1"])  # fmt: skip
def test_grid_counts_below_one_are_one_line(tmp_path, capsys, flags, named):
    line = _one_line(capsys, "grid", GRID, "--out", str(tmp_path / "g"), *flags)
    assert named in line, line
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_grid_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "a file" else tmp_path / "f" / "g"
    line = _one_line(capsys, "grid", GRID, "--out", str(out))
    assert "--out" in line and str(tmp_path / "f") in line, line
    assert (tmp_path / "f").read_text() == "x"


REPORT = [(["--ci", "1.5"], "--ci 1.5"), (["--ci", "nan"], "--ci nan"), (["--ci", "0"], "--ci 0"),
          (["--resamples", "-5"], "--resamples -5"), (["--resamples", "0"], "--resamples 0"),
          (["--out", "FILE"], "--out FILE"), (["--pack", "FILE"], "--pack FILE")]  # fmt: skip


@pytest.mark.parametrize("flags,named", REPORT, ids=[" ".join(r[0]) for r in REPORT])
def test_report_flags_that_cannot_be_taken_are_one_line(tmp_path, capsys, flags, named):
    (tmp_path / "FILE").write_text("x")
    flags = [str(tmp_path / "FILE") if f == "FILE" else f for f in flags]
    line = _one_line(capsys, "report", str(tmp_path), *flags)
    assert named.replace("FILE", str(tmp_path / "FILE")) in line, line
    assert (tmp_path / "FILE").read_text() == "x"


@pytest.mark.parametrize("flags,named", [(["--device", "bogus"], "--device"), (["--device", "meta"], "--device"),
                                         (["--batch-size", "0"], "--batch-size 0"), (["--k", "0"], "--k 0")],
                         ids=["device-bogus", "device-meta", "batch-size0", "k0"])  # fmt: skip
def test_eval_flags_that_cannot_be_taken_are_one_line(capsys, flags, named):
    line = _one_line(capsys, "eval", "--model", "tiny-arith", "--n-problems", "1", "--k", "2", *flags)
    assert named in line and "range()" not in line, line


# --- item 9: taken without a word, or said unclearly --------------------------------------------------------------
def test_a_config_file_with_resume_is_refused(tmp_path, capsys):
    line = _one_line(
        capsys, "train", str(REPO / "configs" / "grpo.yaml"), "--resume", str(tmp_path), "--no-progress"
    )
    assert "--resume" in line and "grpo.yaml" in line and "overrides only" in line, line


def test_the_grid_resumes_without_its_base_config(tmp_path):
    from satrl.experiments.grid import default_command
    from satrl.experiments.spec import expand, load_grid

    run = expand(load_grid(GRID), tmp_path)[0]
    assert str(run.base) in default_command(run, resume=False)
    assert str(run.base) not in default_command(run, resume=True)


@pytest.mark.parametrize("out", ["/dev/null", "FILE", "FILE/run"])
def test_an_out_that_cannot_be_a_folder_is_one_line_naming_out(tmp_path, capsys, out):
    (tmp_path / "FILE").write_text("x")
    out = out.replace("FILE", str(tmp_path / "FILE"))
    line = _one_line(capsys, "train", *TINY, "steps=1", f"out={out}", "--no-progress")
    assert f"out={out}" in line and "not a folder" in line and "Errno" not in line, line


# --- item 8: Ctrl-C -------------------------------------------------------------------------------------------------
def test_ctrl_c_is_one_line_naming_the_resume_and_exit_130(tmp_path):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
    }
    p = subprocess.Popen([sys.executable, "-m", "satrl", "train", *TINY, "steps=200", f"out={out}", "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
            assert p.poll() is None and time.monotonic() < deadline, (
                p.stderr.read() if p.poll() is not None else ""
            )
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [x for x in err.splitlines() if x.strip()]
    assert p.returncode == 130 and len(lines) == 1, (p.returncode, err[-3000:])
    assert f"satrl train --resume {out}" in lines[0] and "Traceback" not in lines[0], lines
