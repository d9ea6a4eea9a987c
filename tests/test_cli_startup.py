"""The command line answers at once: ``satrl --version``, ``satrl --help`` and every ``satrl CMD --help`` import no
torch, transformers, Ray, vLLM, matplotlib, pandas or numpy (issue 56; their time is measured by
``python -m benchmarks.cli_startup``, docs/benchmarks.md "Command-line start-up").

Each check runs in a fresh interpreter: this process has imported torch long ago."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from run_helpers import REPO
from satrl import cli

HEAVY = ("torch", "transformers", "ray", "vllm", "matplotlib", "pandas", "numpy", "safetensors", "scipy")

# Runs each command's help (and --version) as `satrl` does, one after the other, and prints after each the heavy
# modules imported so far.
PROBE = """
import contextlib, io, json, sys
from satrl import cli
heavy = set(json.loads(sys.argv[2]))
after = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(argv)
    after.append(sorted({m.split(".")[0] for m in sys.modules} & heavy))
print(json.dumps(after))
"""


def _heavy_after(argvs: list[list[str]]) -> list[list[str]]:
    """For each of ``argvs`` run in turn in one fresh interpreter, the heavy modules imported by then."""
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs), json.dumps(HEAVY)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


HELPS = [["--version"], ["--help"], *[[name, "--help"] for name in cli.COMMANDS]]


@pytest.fixture(scope="module")
def heavy_by_help() -> dict[str, list[str]]:
    """All the helps in one fresh interpreter (one start-up, not one each): sys.modules only grows, so a help that
    imports something heavy shows it as new after its own turn, whatever ran before it."""
    after = _heavy_after(HELPS)
    before = [[], *after[:-1]]
    return {" ".join(argv): sorted(set(a) - set(b)) for argv, a, b in zip(HELPS, after, before)}


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_help_and_version_import_nothing_heavy(argv, heavy_by_help):
    assert heavy_by_help[" ".join(argv)] == []


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a command that does import torch (eval's run, on a missing model) is seen."""
    assert "torch" in _heavy_after([["eval", "--model", str(REPO / "no-such-model"), "--k", "1"]])[-1]


def test_version_prints_the_commit_unwrapped(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out == cli.version_line() + "\n"
    assert out.startswith("satrl 0.") and "distribution satrl-async" in out


# Loads a config with each list of overrides, as `satrl train CONFIG key=value` does, then runs the checks before a
# run, and prints each outcome and the heavy modules imported after the loads and after the checks.
LOAD_PROBE = """
import json, sys
from satrl.config import ConfigError, check_before_run, load_config
outcomes = []
for overrides in json.loads(sys.argv[2]):
    try:
        cfg = load_config(sys.argv[1], overrides)
        outcomes.append("ok")
    except ConfigError as err:
        outcomes.append("ConfigError: " + str(err))
heavy = lambda: sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[3])))
loaded = heavy()
check_before_run(load_config(sys.argv[1], []))
print(json.dumps([outcomes, loaded, heavy()]))
"""

BAD = [["stepz=3"], ["steps=abc"], ["objective.name=nope"], ["objective.trust_region.alpha=2"]]


@pytest.fixture(scope="module")
def loaded() -> tuple[list[str], list[str], list[str]]:
    """One fresh interpreter for both tests below: the outcomes of the loads, the heavy modules after them, and
    after the checks before a run that follow."""
    r = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(REPO / "configs" / "sat_grpo.yaml"),
                        json.dumps([["steps=3"], *BAD]), json.dumps(HEAVY)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    outcomes, heavy, checked = json.loads(r.stdout.strip().splitlines()[-1])
    return outcomes, heavy, checked


def test_a_config_is_validated_without_importing_anything_heavy(loaded):
    """A config error that needs no model (a misspelt key, a wrong type, an unknown preset, a value out of range)
    is reported before torch or transformers is imported: the config, its sections and the registries they check
    names against are light (issue 56)."""
    outcomes, heavy, _ = loaded
    assert outcomes[0] == "ok"
    assert all(o.startswith("ConfigError: invalid config: ") for o in outcomes[1:]), outcomes
    assert [o.split(":")[2].strip() for o in outcomes[1:]] == ["stepz", "steps", "objective.name",
                                                               "objective.trust_region"]  # fmt: skip
    assert heavy == []


def test_the_load_probe_sees_a_heavy_import(loaded):
    """The check can fail: the checks before a run read the torch engine's arguments, which imports torch."""
    assert "torch" in loaded[2]
