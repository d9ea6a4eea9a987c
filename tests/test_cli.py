"""The ``satrl`` command line: every --help, flags mixed with key=value overrides, plain output off a terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from run_helpers import REPO, TINY
from satrl import cli
from satrl.apps.train import LEGACY_ENV

HELPS = [[], *[[name] for name in cli.COMMANDS]]


@pytest.mark.parametrize("words", HELPS, ids=lambda w: " ".join(w) or "satrl")
def test_every_help_exits_zero_with_its_usage(words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*words, "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.startswith(f"usage: satrl {' '.join(words)}".rstrip())
    if not words:  # the top level lists every command with its help (argparse puts it below a long name)
        assert all(f"    {name} " in out or f"    {name}\n" in out for name in cli.COMMANDS)


def test_help_of_the_installed_program():
    """`python -m satrl --help` (the console script's module) in a fresh interpreter, as a user runs it."""
    r = subprocess.run([sys.executable, "-m", "satrl", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "report" in r.stdout and "95% CIs" in r.stdout


def test_docstring_names_exactly_the_commands():
    first = cli.__doc__.splitlines()[0]
    listed = first.split(":", 1)[1].strip(" .").split(" | ")
    assert listed == list(cli.COMMANDS)


def _printed_config(capsys, *argv: str) -> dict:
    assert cli.main(["train", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv",
    [
        ["configs/grpo.yaml", "--no-progress", "steps=8", "seed=3", "--print-config"],
        ["--no-progress", "configs/grpo.yaml", "steps=8", "--print-config", "seed=3"],
        ["configs/grpo.yaml", "steps=8", "--print-config", "seed=3", "--no-progress"],
        ["--print-config", "configs/grpo.yaml", "steps=8", "--no-progress", "seed=3"],
    ],
    ids=["flag-first", "flags-around-file", "flag-between", "all-mixed"],
)
def test_flags_and_overrides_mix_in_any_order(argv, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = _printed_config(capsys, *argv)
    assert (cfg["steps"], cfg["seed"]) == (8, 3)
    assert cfg == _printed_config(capsys, "configs/grpo.yaml", "steps=8", "seed=3", "--print-config")


def test_overrides_without_a_config_file_and_with_resume(capsys):
    assert _printed_config(capsys, "steps=5", "--print-config", "seed=2")["steps"] == 5
    args = cli.parse_args(["train", "--resume", "runs/x", "steps=9", "--no-progress"])
    assert (args.resume, args.config, args.overrides, args.no_progress) == ("runs/x", "steps=9", [], True)
    args = cli.parse_args(["demo", "--seed", "1", "train.threads=1", "--lag", "4", "steps=3"])
    assert (args.seed, args.lag, args.overrides) == (1, 4, ["train.threads=1", "steps=3"])


def test_settings_once_read_from_the_environment_are_config_keys(capsys, monkeypatch):
    """SATRL_TORCH_THREADS and the SATRL_RAY_* variables become overrides, so config.yaml records them;
    an explicit override wins; without them the config holds the defaults."""
    for var in LEGACY_ENV:
        monkeypatch.delenv(var, raising=False)
    cfg = _printed_config(capsys, "steps=5", "--print-config")
    assert cfg["train"]["max_threads"] is None and cfg["ray"] == {"address": None, "workers": 1, "gpus": 0.0}
    monkeypatch.setenv("SATRL_TORCH_THREADS", "1")
    monkeypatch.setenv("SATRL_RAY_WORKERS", "3")
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    monkeypatch.setenv("SATRL_RAY_ADDRESS", "auto")
    assert cli.main(["train", "ray.workers=2", "--print-config"]) == 0
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    assert cfg["train"]["max_threads"] == 1 and cfg["ray"]["workers"] == 2 and cfg["ray"]["address"] == "auto"
    assert "SATRL_TORCH_THREADS=1 taken as train.max_threads=1" in err


def test_trainer_threads_are_capped_by_max_threads():
    from satrl.config import load_config

    assert load_config(None, ["train.threads=4", "train.max_threads=2"]).trainer_threads == 2
    assert load_config(None, ["train.threads=1", "train.max_threads=2"]).trainer_threads == 1
    assert load_config(None, ["train.threads=3"]).trainer_threads == 3


def test_bad_override_after_a_flag_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["train", "configs/grpo.yaml", "--no-progress", "stepz=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stepz" in err[0]


def test_unknown_command_is_argparse_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench"])
    assert exc.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err


def test_train_off_a_terminal_prints_plain_lines_and_no_third_party_bars(tmp_path, capfd):
    """A real tiny run with stdout captured (not a TTY), as in a log file: one plain line per step here
    (2 steps), no rich bar glyphs, no transformers "Loading weights" bar on stderr."""
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "steps=2", f"out={out}"]) == 0
    captured = capfd.readouterr()
    lines = [x for x in captured.out.splitlines() if " step " in x]
    assert [x.split(" step ")[1].split()[0] for x in lines] == ["1/2", "2/2"]
    assert all(x.startswith(str(out)) and " reward " in x and " gate " in x for x in lines)
    assert "━" not in captured.out and "Loading weights" not in captured.err
    assert "%|" not in captured.err  # no tqdm bar of any kind


def test_output_into_a_closed_pipe_is_not_a_traceback():
    """`satrl grid ... --dry-run | head -1`: the reader leaves early; satrl stops without a traceback."""
    import subprocess
    import sys

    cmd = f"'{sys.executable}' -m satrl grid configs/grids/sat_trial.yaml --dry-run --out /nonexistent | head -1"
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.stdout.startswith("[new] grpo/lag1/seed0: ")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_version_prints_the_version_and_the_commit():
    import re
    import subprocess
    import sys
    from pathlib import Path

    import satrl

    out = subprocess.run([sys.executable, "-m", "satrl", "--version"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=60)  # fmt: skip
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()) == 1, out.stdout + out.stderr
    assert out.stdout.startswith(f"satrl {satrl.__version__} (distribution satrl-async, commit ")
    assert re.search(r"commit [0-9a-f]{40}(\+dirty)?\)$", out.stdout.strip())


def test_demo_help_names_every_method_it_runs():
    """The demo's help says what it runs (it once said "SAT-GRPO vs GRPO" while running VCPO too)."""
    from satrl.apps.demo import METHODS

    shown = {"grpo": "GRPO", "sat_grpo": "SAT-GRPO", "vcpo": "VCPO"}
    assert set(METHODS) <= set(shown) and all(shown[m] in cli.COMMANDS["demo"] for m in METHODS)


def test_eval_help_names_every_builtin_task_and_numerics(capsys):
    from satrl.engines.numerics import NUMERICS
    from satrl.models import BUILTINS
    from satrl.tasks import TASKS

    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps lines, at hyphens too
    for name in [*BUILTINS.names(), *TASKS.names(), *NUMERICS.names()]:
        assert name in out, name
    from satrl.config.run import MAX_EVAL_K

    assert f"--k K samples per problem for avg@k, in [1, {MAX_EVAL_K}]" in out  # the help's bound is the config's
