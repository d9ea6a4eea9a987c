"""configs/regimes/: a trial's regime as one config a user can run. Each command its header prints resolves to
exactly the configuration of the trial's run it names (every field, seed included, but ``out``), so "what to
turn on" in the README runs what the trial ran."""

import re
import shlex

from run_helpers import REPO

REGIME = REPO / "configs" / "regimes" / "repair_trial.yaml"
# the header's commands (by their out=) and the repair trial's run each one repeats
RUNS = {"runs/vcpo32": "vcpo/lag32/seed24", "runs/grpo32": "grpo/lag32/seed24", "runs/grpo0": "grpo/lag0/seed24"}


def _header_commands() -> dict[str, list[str]]:
    """out= -> the overrides of each `satrl train configs/regimes/repair_trial.yaml ...` line in the header."""
    found = {}
    for line in REGIME.read_text().splitlines():
        m = re.match(r"#\s+satrl train configs/regimes/repair_trial\.yaml (.*?)(\s+#.*)?$", line)
        if m:
            args = shlex.split(m.group(1))
            out = next(a.split("=", 1)[1] for a in args if a.startswith("out="))
            found[out] = [a for a in args if not a.startswith("out=")]
    return found


def _resolved(path, overrides: list[str]) -> dict:
    from satrl.config import load_config

    return load_config(path, overrides).model_dump(exclude={"out"})


def test_each_header_command_is_the_trial_run_it_names():
    from satrl.experiments.spec import expand, load_grid

    commands = _header_commands()
    assert set(commands) == set(RUNS)
    grid = {r.name: r for r in expand(load_grid(REPO / "configs" / "grids" / "repair_trial.yaml"), "runs/x")}
    for out, name in RUNS.items():
        run = grid[name]
        trial = _resolved(run.base, [*run.overrides, f"seed={run.seed}"])
        assert _resolved(REGIME, commands[out]) == trial, f"{out} differs from the trial's {name}"


def test_the_check_sees_a_changed_setting():
    """The comparison is over every field: one changed setting (the lr) makes the configurations differ."""
    from satrl.experiments.spec import expand, load_grid

    run = next(r for r in expand(load_grid(REPO / "configs" / "grids" / "repair_trial.yaml"), "x")
               if r.name == RUNS["runs/grpo32"])  # fmt: skip
    assert _resolved(REGIME, ["train.lr=6e-5"]) != _resolved(run.base, [*run.overrides, f"seed={run.seed}"])
