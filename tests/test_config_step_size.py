"""Config keys of the step-size seam and the fresh eval set: train.lr_lag_scaling, the vcpo objective's keys,
eval.problem_seed. Saved in config.yaml and loaded back; a bad value is one line naming the key; the defaults are
what every earlier run did."""

import pytest
import yaml

from satrl.config import ConfigError, build_config, load_config


def test_defaults_are_the_earlier_runs():
    cfg = load_config(None, [])
    assert cfg.train.lr_lag_scaling == "none" and cfg.eval.problem_seed is None
    assert cfg.task_kwargs == {}  # the task builds with its own eval_seed (0), as before
    assert load_config(None, ["task.kwargs.eval_seed=3"]).task_kwargs == {"eval_seed": 3}


def test_new_keys_are_saved_and_load_back(tmp_path):
    cfg = load_config(None, ["objective.name=vcpo", "objective.ess_rule=linear", "objective.baseline=group_mean",
                             "train.lr_lag_scaling=inverse_sqrt", "eval.problem_seed=1000"])  # fmt: skip
    saved = cfg.model_dump(mode="json")
    assert saved["train"]["lr_lag_scaling"] == "inverse_sqrt" and saved["eval"]["problem_seed"] == 1000
    assert saved["objective"]["correction"] == {"name": "vcpo", "ess_rule": "linear", "ess_base_ratio": 1.0,
                                                "ess_weight_cap": None, "ess_step": True,
                                                "baseline": "group_mean"}  # fmt: skip
    assert cfg.task_kwargs == {"eval_seed": 1000}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg == build_config(saved) and again.model_dump(mode="json") == saved


def test_a_saved_config_without_the_new_keys_loads_with_the_defaults(tmp_path):
    """A run directory written before these keys existed resumes as what it was."""
    saved = load_config(None, []).model_dump(mode="json")
    del saved["train"]["lr_lag_scaling"], saved["eval"]["problem_seed"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    assert load_config(tmp_path / "config.yaml") == load_config(None, [])


@pytest.mark.parametrize("overrides, needle", [
    (["train.lr_lag_scaling=linear"], "invalid config: train.lr_lag_scaling: got 'linear'"),
    (["eval.problem_seed=-1"], "invalid config: eval.problem_seed: "),
    (["objective.name=vcpo", "objective.ess_rule=cube"], "ess_rule: got 'cube'"),
    (["objective.name=vcpo", "objective.ess_base_ratio=0"], "ess_base_ratio: "),
    (["objective.name=vcpo", "objective.baseline=learned"], "baseline: got 'learned'"),
    (["objective.ess_rule=sqrt"], "unknown objective key 'ess_rule'"),  # grpo has no step-size rule
    (["eval.problem_seed=5", "task.kwargs.eval_seed=0"], "eval.problem_seed=5 and task.kwargs.eval_seed=0"),
])  # fmt: skip
def test_bad_values_are_one_line_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_task_without_an_eval_seed_refuses_the_problem_seed_in_one_line(tmp_path):
    from satrl.tasks import TaskError, make_task

    data = tmp_path / "math.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n', encoding="utf-8")
    cfg = load_config(None, ["task.name=jsonl_math", f"task.kwargs.path={data}", "eval.problem_seed=1000"])
    with pytest.raises(TaskError) as err:
        make_task(cfg.task.name, **cfg.task_kwargs)
    assert "eval_seed" in str(err.value) and "\n" not in str(err.value)
