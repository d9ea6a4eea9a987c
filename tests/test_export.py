"""One's own run, usable: `satrl export RUN_DIR OUT` writes a Hugging Face folder that transformers loads with the
checkpoint's weights bit for bit, and `satrl eval` on the run directory and on that folder scores exactly what the
run's own evaluator logged (same problems, engine, numerics, seed, threads). Bad input is one line and exit 2,
and the run directory is never written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import REPO, TINY, read_jsonl
from satrl import cli
from satrl.config import load_config
from satrl.loop.orchestrator import train

# 2 batches of 2 steps; evaluations at steps 0, 2 and 4 on 6 val + 6 test problems, k=4. At seed 0 the val-best
# evaluation is step 0, so the next checkpoint (step 2) is kept beside the latest (step 4): two to choose from.
ARGS = [*TINY, "steps=4", "seed=0", "eval.every=2", "eval.val_problems=6", "eval.test_problems=6", "eval.k=4"]
SCORES = ("avg_at_k", "greedy_acc", "val_avg_at_k", "val_greedy_acc", "val_pass_at_k", "val_n", "test_avg_at_k",
          "test_greedy_acc", "test_pass_at_k", "test_n", "k")  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    threads = torch.get_num_threads()
    train(load_config(REPO / "configs" / "sat_grpo.yaml", [*ARGS, f"out={out}"]))
    torch.set_num_threads(threads)
    return out


@pytest.fixture(autouse=True)
def _keep_threads():
    threads = torch.get_num_threads()  # satrl eval sets the run's thread count in this process
    yield
    torch.set_num_threads(threads)


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}  # fmt: skip


def _logged(run: Path) -> dict[int, dict]:
    return {row["step"]: row for row in read_jsonl(run / "eval.jsonl")}


def _satrl(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _scored(capsys, *argv: str) -> dict:
    rc, out, err = _satrl(capsys, "eval", *argv, "--json")
    assert rc == 0, err
    return json.loads(out.splitlines()[-1])


def test_the_run_is_worth_checking(run):
    """The scores below can tell checkpoints apart: each evaluation logged different numbers."""
    rows = _logged(run)
    assert sorted(rows) == [0, 2, 4]
    assert len({tuple(r[k] for k in SCORES) for r in rows.values()}) == 3
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000002", "step-000004"]


def test_export_loads_with_transformers_bit_for_bit(run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from satrl.models import load_tokenizer

    before = _files(run)
    out = tmp_path / "hf"
    rc, printed, err = _satrl(capsys, "export", run, out)
    assert rc == 0, err
    assert f"to {out}" in printed and f"satrl eval --model {out}" in printed
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    want = load_file(run / "checkpoints" / "step-000004" / "model.safetensors")
    got = model.state_dict()
    assert set(got) == set(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    base = AutoModelForCausalLM.from_pretrained(REPO / "src/satrl/models/checkpoints/tiny-arith")
    assert not all(torch.equal(base.state_dict()[k], want[k]) for k in want)  # trained: not the base's weights
    tokenizer, own = AutoTokenizer.from_pretrained(out, local_files_only=True), load_tokenizer("tiny-arith")
    for text in ("12+34=", "987+6=", "<unk> ?"):
        assert tokenizer(text)["input_ids"] == own(text)["input_ids"]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (own.eos_token_id, own.pad_token_id)
    info = json.loads((out / "satrl_export.json").read_text())
    assert (info["checkpoint"], info["step"], info["model"]) == ("step-000004", 4, "tiny-arith")
    assert _files(run) == before  # nothing written into the run


def test_eval_of_the_run_and_of_its_export_equal_the_runs_own_last_eval(run, tmp_path, capsys):
    logged = _logged(run)[4]
    from_run = _scored(capsys, run)
    assert from_run["step"] == 4 and {k: from_run[k] for k in SCORES} == {k: logged[k] for k in SCORES}
    out = tmp_path / "hf"
    assert _satrl(capsys, "export", run, out)[0] == 0
    flags = json.loads((out / "satrl_export.json").read_text())["eval_flags"]
    from_export = _scored(capsys, "--model", out, *flags)
    assert {k: from_export[k] for k in SCORES} == {k: logged[k] for k in SCORES}
    # the same folder under another seed scores other samples: the match above is not a coincidence of defaults
    reseeded = _scored(capsys, "--model", out, *flags, "--seed", "1")
    assert {k: reseeded[k] for k in SCORES} != {k: logged[k] for k in SCORES}


def test_a_moe_run_exports_in_the_hub_layout_and_loads_bit_for_bit(tmp_path, capsys):
    """transformers holds a MoE's experts fused (``experts.gate_up_proj``) and saves them one by one (the Hub's
    layout): the export round-trips through that conversion to the checkpoint's tensors exactly."""
    from transformers import AutoModelForCausalLM

    run = tmp_path / "moe"
    train(load_config(REPO / "configs" / "sat_grpo.yaml", [*TINY, "steps=2", "model.name=tiny-arith-moe", f"out={run}"]))
    assert _satrl(capsys, "export", run, tmp_path / "hf")[0] == 0
    want = load_file(run / "checkpoints" / "step-000002" / "model.safetensors")
    assert any(".experts.0." in k for k in load_file(tmp_path / "hf" / "model.safetensors"))  # per expert on disk
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_chosen_step_is_exported_and_evaluated(run, tmp_path, capsys):
    out = tmp_path / "hf2"
    assert _satrl(capsys, "export", run, out, "--step", "2")[0] == 0
    want = load_file(run / "checkpoints" / "step-000002" / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in got) and set(want) - set(got) <= {"lm_head.weight"}  # tied
    scored = _scored(capsys, "--model", run, "--step", "2")  # --model takes a run directory too
    assert scored["step"] == 2 and {k: scored[k] for k in SCORES} == {k: _logged(run)[2][k] for k in SCORES}


def test_flags_override_the_runs_settings(run, capsys):
    scored = _scored(capsys, run, "--k", "1", "--n-problems", "3", "--numerics", "fp32")
    assert (scored["k"], scored["n_problems"], "val_n" in scored) == (1, 3, False)
    assert scored["sampling"]["max_new_tokens"] == 5  # the run's, not the flag's default


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, symlinks=True)
    return to


def _outside_latest(run, tmp):
    other = _copy(run, tmp / "other")
    (run / "checkpoints" / "latest").write_text(f"../../{other.name}/checkpoints/step-000004\n")


def _symlinked_checkpoint(run, tmp):
    other = _copy(run, tmp / "other")
    target = run / "checkpoints" / "step-000004"
    shutil.rmtree(target)
    target.symlink_to(other / "checkpoints" / "step-000004")


def _damaged_weights(run, tmp):
    weights = run / "checkpoints" / "step-000004" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))


BAD = {  # case -> (how to spoil a copy of the run, argv after `export RUN OUT`, what the line names)
    "no run": (lambda run, tmp: shutil.rmtree(run), [], "no such run directory"),
    "not a run": (lambda run, tmp: (run / "config.yaml").unlink(), [], "not a run directory"),
    "no checkpoint": (lambda run, tmp: shutil.rmtree(run / "checkpoints"), [], "no checkpoint yet"),
    "unknown step": (lambda run, tmp: None, ["--step", "3"], "steps kept: 2, 4"),
    "latest outside": (_outside_latest, [], "refusing to read outside the run directory"),
    "checkpoint symlinked outside": (_symlinked_checkpoint, [], "outside the run directory"),
    "damaged weights": (_damaged_weights, [], "does not match the sha256"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, case):
    spoil, argv, says = BAD[case]
    mine = _copy(run, tmp_path / "run")
    spoil(mine, tmp_path)
    before = _files(mine) if mine.exists() else None
    out = tmp_path / "hf"
    rc, printed, err = _satrl(capsys, "export", mine, out, *argv)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert str(mine) in err and not out.exists() and printed == ""
    assert (_files(mine) if mine.exists() else None) == before
    if case != "no run":  # (satrl eval reads a missing path as a model's, and says that it does not exist)
        rc, _, err = _satrl(capsys, "eval", mine, *argv)
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("where", ["non-empty", "file", "inside the run"])
def test_out_must_be_new_or_empty_and_outside_the_run(run, tmp_path, capsys, where):
    out = {"non-empty": tmp_path / "full", "file": tmp_path / "f", "inside the run": run / "hf"}[where]
    if where == "non-empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif where == "file":
        out.write_text("mine")
    before = _files(run)
    rc, _, err = _satrl(capsys, "export", run, out)
    assert rc == 2 and str(out) in err and len(err.strip().splitlines()) == 1, err
    assert _files(run) == before
    assert where != "non-empty" or [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_empty_out_folder_is_used(run, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert _satrl(capsys, "export", run, out)[0] == 0
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".empty.*"))  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~umask}  # shared like any folder
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


def test_eval_refuses_step_without_a_run_and_two_targets(run, capsys):
    for argv, says in ((["--model", "tiny-arith", "--step", "2"], "--step needs a run directory"),
                       ([run, "--model", "tiny-arith"], "not both"), ([], "nothing to evaluate"),
                       ([run, "--engine-arg", "foo=1"], "unexpected keyword argument 'foo'")):  # fmt: skip
        rc, _, err = _satrl(capsys, "eval", *argv)
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_the_printed_flags_give_back_every_setting():
    """What `satrl export` records as eval_flags, parsed by `satrl eval`, is the run's evaluation exactly."""
    import argparse
    import dataclasses

    from satrl.apps.eval import EvalSettings, add_eval_args

    cfg = load_config(REPO / "configs" / "sat_grpo.yaml", [*ARGS, "eval.engine_kwargs={max_batch_size: 7}",
                                                           "task.kwargs={digits: 2, ops: '+-'}", "seed=3"])  # fmt: skip
    want = EvalSettings.of_run(cfg)
    assert (want.task_kwargs, want.engine_kwargs, want.seed, want.threads) == ({"digits": 2, "ops": "+-"},
                                                                              {"max_batch_size": 7}, 3, 1)  # fmt: skip
    parser = argparse.ArgumentParser()
    add_eval_args(parser)
    args = parser.parse_args(["--model", "x", *want.flags()])
    assert EvalSettings().overridden(args) == want
    assert EvalSettings().overridden(parser.parse_args(["--model", "x"])) == EvalSettings()  # the plain defaults
    other = dataclasses.replace(want, task="countdown", task_kwargs={})
    assert want.overridden(parser.parse_args(["x", "--task", "countdown"])) == other  # another task's arguments go
