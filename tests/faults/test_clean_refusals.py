"""Issue 34, items 8 and 9: tracebacks and unclear messages that become one line and exit 2 (each failed
before its fix): `satrl report` on a folder without grid runs, `satrl grid` on a file that is not YAML, a
checkpoint of the other layout (one process vs data parallel), a damaged data-parallel shard, a prompt longer
than the context."""

import argparse

import pytest
import torch

from satrl.training import checkpoint as ckpt


def _report(capsys, folder) -> str:
    from satrl.apps.report import add_report_args, run_report

    p = argparse.ArgumentParser()
    add_report_args(p)
    capsys.readouterr()
    assert run_report(p.parse_args([str(folder)])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("what", ["empty", "one run"])
def test_report_on_a_folder_without_grid_runs(tmp_path, capsys, what):
    folder = tmp_path / "x"
    folder.mkdir()
    if what == "one run":
        (folder / "config.yaml").write_text("seed: 0\n")
        (folder / "metrics.jsonl").write_text('{"step": 1}\n')
        (folder / "summary.json").write_text('{"status": "finished"}\n')
    before = sorted(p.name for p in folder.iterdir())
    line = _report(capsys, folder)
    assert str(folder) in line and "no grid runs" in line
    assert sorted(p.name for p in folder.iterdir()) == before  # no stray figures/


def test_grid_on_a_file_that_is_not_yaml(tmp_path, capsys):
    from satrl.apps.grid import add_grid_args, run_grid

    bad = tmp_path / "g.yaml"
    bad.write_text("cells: {a: [1, 2\nlags: ]\n")
    p = argparse.ArgumentParser()
    add_grid_args(p)
    assert run_grid(p.parse_args([str(bad), "--out", str(tmp_path / "out")])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "YAML" in err[0], err


def _saved(tmp_path, extra=None):
    return ckpt.save_checkpoint(tmp_path / "checkpoints", 2, {"w": torch.ones(3)}, {"trainer": {"version": 2}},
                                write_extra=extra)  # fmt: skip


def test_a_truncated_shard_is_one_line_naming_it(tmp_path):
    def shards(folder):
        (folder / "shards").mkdir()
        (folder / "shards" / "model-00001.safetensors").write_bytes(b"x" * 1000)

    path = _saved(tmp_path, shards)
    shard = path / "shards" / "model-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:500])
    with pytest.raises(ckpt.CheckpointError, match=r"shards/model-00001.safetensors does not match the checksum"):
        ckpt.load_checkpoint(path)


@pytest.mark.parametrize("data_parallel", [True, False])
def test_a_checkpoint_of_the_other_layout_names_the_way_on(tmp_path, data_parallel):
    path = _saved(tmp_path, None if data_parallel else lambda folder: (folder / "shards").mkdir())
    trainer = {"version": 2, "opt": {}} if data_parallel else {"version": 2}  # a DP one's "opt" is in its shards
    want = "resume it without torchrun" if data_parallel else "resume it under torchrun"
    with pytest.raises(ckpt.CheckpointError, match=want) as err:
        ckpt.check_layout(path, trainer, data_parallel)
    assert "damaged" not in str(err.value) and str(path) in str(err.value)


def test_a_prompt_longer_than_the_context_says_so():
    from types import SimpleNamespace

    from satrl.config import ConfigError, load_config
    from satrl.launch.setup import check_context

    cfg = load_config(None, ["engine.max_new_tokens=8"])
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    problem = SimpleNamespace(prompt="x" * 100)
    with pytest.raises(ConfigError) as err:
        check_context(cfg, model, lambda text: {"input_ids": list(text)}, [problem])
    assert "at most -" not in str(err.value) and "100 tokens" in str(err.value)
    assert "context" in str(err.value) and "prompt" in str(err.value)


def test_a_lone_surrogate_in_a_dataset_row_is_a_counted_skip(tmp_path):
    """A ``\\ud800`` escape decodes to a string no encoder takes: that row is skipped and counted, with its line."""
    from satrl.tasks import make_task

    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2\\ud800", "answer": "4"}\n'
                    '{"problem": "3+3", "answer": "6"}\n')  # fmt: skip
    with pytest.warns(UserWarning, match="skipped 1 malformed rows"):
        task = make_task("jsonl_math", path=str(data))
    assert [n for n, _ in task.skipped] == [2] and "surrogate" in task.skipped[0][1]
    for split in ("train", "eval"):
        for p in task._splits[split]:
            p.prompt.encode("utf-8")


@pytest.mark.parametrize("key", ["engine.timeout_s", "engine.start_timeout_s"])
def test_an_engine_deadline_under_a_second_is_refused(key):
    """``engine.timeout_s=1e-300`` restarted the engine at once, again and again (the backend checks its
    deadlines once a second): a deadline under a second is a config error naming the key."""
    from satrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [f"{key}=1e-300"])
    load_config(None, [f"{key}=1"])


def test_the_skipped_rows_warning_is_printed_once(tmp_path):
    """The main process builds the task first and warns of its skipped rows; the rollout worker (the engine
    process on the local backend) builds it again and must not print the same warning a second time."""
    import warnings

    from satrl.pipeline.engines_host.worker import RolloutWorker, WorkerSpec

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"problem": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(40)) + "not json\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        RolloutWorker(WorkerSpec(model="tiny-arith", task="jsonl_math", task_kwargs={"path": str(data), "eval_fraction": 0.5}))
    assert not [w for w in seen if "skipped" in str(w.message)], [str(w.message) for w in seen]
