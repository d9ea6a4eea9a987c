"""Issue 60: every setting that learns nothing or hangs is refused in one line, exit 2, before any work.

In process (``load_config``, ``load_grid``, ``satrl.cli.main``): each case returns at once on the fixed code and
learned nothing, hung or grew memory before (group_size=1, lag.n=1e9, seeds: 1e9, --k 1e9, a YAML alias bomb,
--lr inf).
"""

import pytest

from satrl.cli import main
from satrl.config import ConfigError, load_config
from satrl.config.run import MAX_EVAL_K
from satrl.experiments.spec import MAX_SEEDS, load_grid
from satrl.pipeline.schedules import MAX_LAG
from satrl.training.pretrain import PretrainSettings

# A billion laughs under task.kwargs: nine levels of ten aliases, 10^9 strings once expanded.
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def refused(overrides: list[str], *words: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


@pytest.mark.parametrize("n", [0, 1])
def test_group_size_below_two_refused(n):
    refused([f"train.group_size={n}"], "train.group_size", "advantage")
    assert load_config(None, ["train.group_size=2"]).train.group_size == 2


@pytest.mark.parametrize("key", ["lag.n", "lag.max_staleness"])
def test_lag_beyond_bound_refused(key):
    refused([f"{key}=1000000000"], key, str(MAX_LAG))
    assert load_config(None, [f"{key}={MAX_LAG}", "lag.schedule=fixed"]) is not None


@pytest.mark.parametrize("key", ["seed", "steps", "eval.problem_seed", "train.group_size", "lag.n"])
def test_boolean_for_integer_refused(key):
    refused([f"{key}=true"], key, "boolean")


def test_yaml_alias_bomb_refused_in_config_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("task:\n  kwargs:\n" + "".join("    " + line + "\n" for line in BOMB.splitlines()))
    with pytest.raises(ConfigError, match="anchors and aliases") as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert main(["train", str(path), "--print-config"]) == 2


def test_yaml_alias_refused_in_override():
    refused(["task.kwargs.x=[&a [1, 2], *a]"], "task.kwargs.x", "aliases")


def test_yaml_alias_refused_in_grid(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("cells:\n  a: {}\nlags: [1]\nbase: x.yaml\nextra:\n  task.kwargs.x: &a [1]\n"
                    "  task.kwargs.y: *a\n")  # fmt: skip
    with pytest.raises(ValueError, match="anchors and aliases"):
        load_grid(path, check_paths=False)


def _grid(tmp_path, seeds: int) -> str:
    (tmp_path / "base.yaml").write_text("steps: 2\n")
    path = tmp_path / "g.yaml"
    path.write_text(f"base: base.yaml\ncells:\n  a: {{}}\nlags: [0, 1]\nseeds: {seeds}\n")
    return str(path)


def test_grid_seeds_bounded(tmp_path, capsys):
    with pytest.raises(ValueError, match="seeds"):
        load_grid(_grid(tmp_path, 10**9), check_paths=False)
    assert main(["grid", _grid(tmp_path, 10**9), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    grid = _grid(tmp_path, 2)
    out = str(tmp_path / "o")
    assert main(["grid", grid, "--dry-run", "--seeds", str(10**9), "--out", out]) == 2
    assert f"{MAX_SEEDS:,}" in capsys.readouterr().err
    assert main(["grid", grid, "--dry-run", "--seeds", "2", "--out", out]) == 0


@pytest.mark.parametrize("flag,value,names", [
    ("--k", "1000000000", "eval.k"), ("--temperature", "inf", "engine.temperature"), ("--seed", "-1", "seed"),
    ("--seed", str(2**64), "seed"), ("--top-p", "nan", "engine.top_p"),
])  # fmt: skip
def test_eval_flags_obey_the_config_bounds(capsys, flag, value, names):
    assert main(["eval", "--model", "tiny-arith", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and names in err, err


def test_eval_k_bound_is_the_config_bound(capsys):
    assert main(["eval", "--model", "tiny-arith", "--k", str(MAX_EVAL_K + 1)]) == 2
    refused([f"eval.k={MAX_EVAL_K + 1}"], "eval.k")


@pytest.mark.parametrize("flags", [
    ["--lr", "inf"], ["--lr", "1e30"], ["--lr", "nan"], ["--lr", "-1"], ["--lr", "0"], ["--steps", "0"],
    ["--batch-size", "0"], ["--threads", "0"], ["--digits", "0"], ["--warmup", "-1"], ["--eval-every", "-1"],
    ["--save-every", "-1"], ["--seed", "-1"],
])  # fmt: skip
def test_pretrain_flags_bounded_before_any_work(tmp_path, capsys, flags):
    out = tmp_path / "p"
    args = ["pretrain", "--steps", "1", "--out", str(out), "--no-progress", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flags[0] in err, err
    assert not out.exists()


def test_pretrain_settings_bounded():
    with pytest.raises(ValueError, match="--lr"):
        PretrainSettings(lr=float("inf"))
    assert PretrainSettings(lr=1.0).lr == 1.0
