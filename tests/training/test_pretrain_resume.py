"""``satrl pretrain``'s resume state (``--save-every``, ``--resume``) and micro-batches (``--micro-batch-size``).

A resumed run must be bit-identical to an uninterrupted one (weights, history), whether the first session finished
(``--steps k``, then ``--resume --steps N``) or was killed, even in the middle of writing its state; micro-batches
must give the whole batch's gradient, and ``--micro-batch-size 0`` today's code path bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from satrl.apps import pretrain as app
from satrl.apps.pretrain import add_pretrain_args, command_line, run_pretrain
from satrl.models import build_char_tokenizer, build_tiny_model, load_policy
from satrl.training import pretrain as mod
from satrl.training.pretrain import (
    PretrainSettings,
    accumulate_gradient,
    encode_batch,
    micro_batches,
    pretrain,
)
from satrl.training.pretrain_state import ResumeError

TOK = build_char_tokenizer()
TINY = dict(num_hidden_layers=1)
# moe: routing per token must survive a resume and micro-batching; the periodic score at step 3 lies between saves
BASE = dict(kind="moe", batch_size=4, warmup=3, seed=5, threads=1, final_eval_problems=0, model_cfg=TINY,
            eval_every=3, eval_problems=2)  # fmt: skip


def _run(out, steps, resume=False, **kw):
    return pretrain(PretrainSettings(**{**BASE, "steps": steps, **kw}), out, progress=False, resume=resume)


def _weights(out):
    return load_policy(out)[0].state_dict()


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _history(record):
    return [{k: v for k, v in row.items() if k != "train_s"} for row in record["history"]]  # train_s: wall time


class _Killed(Exception):
    pass


@pytest.mark.parametrize("micro", [0, 3])
@pytest.mark.parametrize("how", ["finished", "killed"])
def test_resumed_run_is_bit_identical_to_a_straight_one(tmp_path, monkeypatch, how, micro):
    straight = _run(tmp_path / "straight", 7, micro_batch_size=micro)
    out = tmp_path / "resumed"
    if how == "finished":  # 4 steps, saved at 2 and at the last one; then --resume --steps 7
        _run(out, 4, save_every=2, micro_batch_size=micro)
    else:  # killed during step 5 of 7: the state of step 4 is left, step 5 is redone
        real, calls = mod._train_step, []

        def dying(*args):
            calls.append(1)
            if len(calls) == 5:
                raise _Killed
            return real(*args)

        monkeypatch.setattr(mod, "_train_step", dying)
        with pytest.raises(_Killed):
            _run(out, 7, save_every=2, micro_batch_size=micro)
        monkeypatch.setattr(mod, "_train_step", real)
    resumed = _run(out, 7, resume=True, save_every=2, micro_batch_size=micro)
    assert _same_weights(_weights(tmp_path / "straight"), _weights(out))
    assert _history(resumed) == _history(straight) and [r["step"] for r in straight["history"]] == [3, 6, 7]
    assert resumed["steps_run"] == 7 and resumed["final_loss"] == straight["final_loss"]
    assert (out / "resume" / "latest").read_text() == "step-000007"  # the state stays: --steps 9 would extend it


def test_a_run_that_stop_avg_ended_stays_ended_unless_the_flag_changes(tmp_path):
    out = tmp_path / "o"
    first = _run(out, 7, save_every=2, stop_avg=0.0)  # stops at the first score, step 3 (saved there)
    again = _run(out, 7, resume=True, save_every=2, stop_avg=0.0)  # as an uninterrupted run would: still 3
    assert first["steps_run"] == again["steps_run"] == 3 and _history(again) == _history(first)
    assert _run(out, 7, resume=True, save_every=2)["steps_run"] == 7  # without --stop-avg it goes on


def test_state_is_safetensors_and_strict_json(tmp_path):
    _run(tmp_path / "o", 2, save_every=2, eval_every=0)
    folder = tmp_path / "o" / "resume" / "step-000002"
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "state.safetensors", "state.json",
                                                  "manifest.json"}  # fmt: skip
    state = json.loads((folder / "state.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert state["loop"]["step"] == 2 and state["settings"]["batch_size"] == 4
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "state.safetensors"))
    assert tensors[state["rng"]["__tensor__"]].dtype == torch.uint8  # the torch RNG state


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_pretrain_args(parser)
    return parser.parse_args(argv)


CLI = ["--model", "tiny-countdown-moe", "--steps", "4", "--batch-size", "2", "--threads", "1",
       "--final-eval-problems", "0", "--micro-batch-size", "1", "--no-progress"]  # fmt: skip


def test_killed_while_writing_its_state_the_countdown_run_resumes_bit_identically(tmp_path):
    """A real crash (SIGKILL) inside the second state write, before its rename: the first state is intact, and the
    countdown train stream continues where it stopped."""
    straight = tmp_path / "straight"
    assert run_pretrain(_parse([*CLI, "--out", str(straight)])) == 0
    out = tmp_path / "resumed"
    env = {**os.environ, "SATRL_FAULT": "checkpoint.state:2"}
    cmd = [sys.executable, "-m", "satrl", "pretrain", *CLI, "--save-every", "2", "--out", str(out)]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "resume" / "latest").read_text() == "step-000002" and not (out / "config.json").exists()
    assert run_pretrain(_parse([*CLI, "--save-every", "2", "--resume", "--out", str(out)])) == 0
    assert _same_weights(_weights(straight), _weights(out))


def test_resume_refuses_other_trajectory_settings_and_allows_the_rest(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["--steps", "2", "--batch-size", "2", "--threads", "1", "--final-eval-problems", "0", "--save-every", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert run_pretrain(_parse(argv)) == 0
    capsys.readouterr()
    for flag, value in [("--batch-size", "3"), ("--micro-batch-size", "1"), ("--lr", "0.002"), ("--seed", "1")]:
        assert run_pretrain(_parse([*argv, "--resume", flag, value])) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"saved with {flag} " in err, err
    # steps and the eval flags may change: a longer run with a periodic score continues
    assert run_pretrain(_parse([*argv, "--resume", "--steps", "3", "--eval-every", "3", "--eval-problems", "2"])) == 0
    assert json.loads((out / "pretrain.json").read_text())["steps_run"] == 3
    with pytest.raises(ResumeError, match="past --steps 2"):
        _run(out, 2, resume=True, batch_size=2, model_cfg={}, threads=1, warmup=50, seed=0, kind="dense")


def test_a_state_in_the_way_or_missing_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["--steps", "1", "--batch-size", "2", "--threads", "1", "--final-eval-problems", "0", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert run_pretrain(_parse([*argv, "--resume"])) == 2
    assert "no resume state to continue" in capsys.readouterr().err
    assert run_pretrain(_parse([*argv, "--save-every", "1"])) == 0
    assert run_pretrain(_parse(argv)) == 2  # nothing silently overwritten
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'resume'} holds the resume state" in err


def test_micro_batches_sort_by_length_and_cut_each_chunk_to_its_longest_row():
    answers = ["1234567", "1", "12345", "34", "1234", "12"]  # "34" before "12": a stable sort keeps them so
    batch = encode_batch(TOK, ["1+1="] * 6, answers)
    chunks = micro_batches(batch, 4)
    assert [c["attention_mask"].sum(1).tolist() for c in chunks] == [[7, 8, 8, 10], [11, 13]]  # BOS+4+answer+EOS
    assert [c["input_ids"].shape[1] for c in chunks] == [10, 13]
    order = [1, 3, 5, 4, 2, 0]
    for key in batch:
        rows = [row.tolist() for c in chunks for row in c[key]]
        assert rows == [batch[key][i, : len(rows[j])].tolist() for j, i in enumerate(order)]
    cut = [batch["attention_mask"][i, c["input_ids"].shape[1] :] for c, rows in zip(chunks, ([1, 3, 5, 4], [2, 0]))
           for i in rows]  # fmt: skip
    assert all(not x.any() for x in cut)  # only padding is cut off


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("size", [1, 2, 4, 5])
def test_micro_batch_gradient_equals_the_whole_batch_gradient(size):
    model = build_tiny_model("moe", vocab_size=len(TOK), seed=3, **TINY).train()
    prompts = ["12+3=", "1+1=", "999+999=", "5+50=", "7+0="]
    batch = encode_batch(TOK, prompts, ["15", "2", "1998" * 3, "55" * 5, "7"])
    whole = model(**batch).loss
    whole.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    value = accumulate_gradient(model, batch, size)
    got = _grads(model)
    assert abs(value - whole.item()) < 1e-6
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_micro_batch_size_0_is_the_one_pass_step_bit_for_bit(tmp_path):
    """Today's step, written out: forward the whole batch, zero the gradients, backward, clip, step."""
    s = PretrainSettings("moe", steps=3, batch_size=4, warmup=2, seed=1, threads=1, final_eval_problems=0,
                         model_cfg=TINY)  # fmt: skip
    record = pretrain(s, tmp_path / "o", progress=False)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = dict(pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id, bos_token_id=TOK.bos_token_id)
        model = build_tiny_model("moe", vocab_size=len(TOK), seed=1, **ids, **TINY).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 2))
        batches = mod._batches(mod._make_task("arithmetic", 3, "+"), 1, 4)
        for _ in range(3):
            loss = model(**encode_batch(TOK, *next(batches))).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    finally:
        torch.set_num_threads(old)
    assert record["final_loss"] == loss.item()
    assert _same_weights(model.state_dict(), _weights(tmp_path / "o"))


def test_router_aux_loss_is_refused_with_micro_batches():
    cfg = {**TINY, "output_router_logits": True, "router_aux_loss_coef": 0.01}
    s = PretrainSettings("moe", steps=1, batch_size=2, threads=1, final_eval_problems=0, model_cfg=cfg,
                         micro_batch_size=1)  # fmt: skip
    with pytest.raises(ValueError, match="router aux loss"):
        pretrain(s, None, progress=False)


def test_command_line_records_micro_batches_not_save_every_or_resume():
    args = _parse(["--model", "tiny-countdown-moe", "--steps", "9", "--micro-batch-size", "16", "--save-every", "100",
                   "--resume", "--out", "d"])  # fmt: skip
    cmd = command_line(args)
    assert cmd == "satrl pretrain --model tiny-countdown-moe --steps 9 --seed 0 --micro-batch-size 16 --out d"
    assert _parse(cmd.split()[2:]).micro_batch_size == 16
    assert "micro_batch_size" not in PretrainSettings().record_args()  # the shipped bases' keys, unchanged
    assert PretrainSettings(micro_batch_size=16).record_args()["micro_batch_size"] == 16


def test_an_interrupted_run_names_the_command_that_resumes_it(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "_run", interrupted)
    assert run_pretrain(_parse(["--steps", "9", "--save-every", "3", "--out", "d"])) == 130
    assert capsys.readouterr().err == ("satrl pretrain: interrupted; continue with satrl pretrain --model tiny-arith "
                                       "--steps 9 --seed 0 --out d --save-every 3 --resume\n")  # fmt: skip


def test_a_train_stream_that_does_not_replay_the_saved_one_is_refused():
    task = mod._make_task("countdown_trace", 3, "+")
    fourth = list(zip(range(4), task.problems("train", 0)))[-1][1].prompt
    assert next(mod._batches(task, 0, 2, start=2, last_prompt=fourth))[0] == [p.prompt for _, p in zip(
        range(6), task.problems("train", 0))][4:]  # fmt: skip
    with pytest.raises(ResumeError, match="is not the saved run's"):
        mod._batches(task, 0, 2, start=2, last_prompt="1 2 3 to 6:")  # raised on the call, before any step
