"""Pretraining: label masking, determinism per seed, the CLI handler and its HF output directory."""

from __future__ import annotations

import argparse
import json

import torch

from satrl.apps.pretrain import add_pretrain_args, command_line, run_pretrain
from satrl.models import build_char_tokenizer, load_policy
from satrl.training.pretrain import PretrainSettings, encode_batch, pretrain

TOK = build_char_tokenizer()
TINY = dict(num_hidden_layers=1)  # keep the test fast; the recipe's 4 layers are exercised by the builtins


def test_encode_batch_labels_only_answer_and_eos():
    b = encode_batch(TOK, ["12+3=", "1+1="], ["15", "2"])
    ids, lab, attn = b["input_ids"], b["labels"], b["attention_mask"]
    assert ids.shape == lab.shape == attn.shape == (2, 1 + 5 + 2 + 1)
    row0 = TOK("12+3=")["input_ids"] + TOK("15", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    assert ids[0].tolist() == row0
    assert lab[0].tolist() == [-100] * 6 + row0[6:]
    # row 1 is right-padded: pad positions are neither attended to nor labelled
    assert lab[1].tolist() == [-100] * 5 + [TOK("2", add_special_tokens=False)["input_ids"][0], 1, -100, -100]
    assert attn[1].tolist() == [1] * 7 + [0, 0]
    assert ids[1, 7:].tolist() == [TOK.pad_token_id] * 2


FAST = dict(threads=1, final_eval_problems=0, model_cfg=TINY)


def _pretrain(kind, steps, batch_size, seed, warmup, out_dir=None, **kw):
    settings = PretrainSettings(kind, steps=steps, batch_size=batch_size, seed=seed, warmup=warmup, **FAST, **kw)
    return pretrain(settings, out_dir, progress=False)


def test_deterministic_for_a_seed(tmp_path):
    runs = []
    for i in range(2):
        _pretrain("moe", 5, 8, seed=7, warmup=2, out_dir=tmp_path / f"run{i}")
        runs.append(load_policy(tmp_path / f"run{i}")[0].state_dict())
    other = _pretrain("moe", 5, 8, seed=8, warmup=2, out_dir=tmp_path / "other")
    a, b = runs
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = load_policy(tmp_path / "other")[0].state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert other["steps_run"] == 5 and len(other["history"]) == 1


def test_training_lowers_the_loss():
    rec = _pretrain("dense", 30, 16, seed=0, warmup=5, eval_every=30, eval_problems=4)
    first = _pretrain("dense", 1, 16, seed=0, warmup=5)
    assert rec["history"][-1]["loss"] < 0.8 * first["history"][-1]["loss"]
    assert rec["history"][-1]["n_problems"] == 4  # the periodic score ran


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_pretrain_args(parser)
    return parser.parse_args(argv)


def test_command_line_round_trips():
    args = _parse(["--model", "tiny-arith-moe", "--steps", "12", "--out", "d", "--lr", "0.002"])
    cmd = command_line(args)
    assert cmd == "satrl pretrain --model tiny-arith-moe --steps 12 --seed 0 --lr 0.002 --out d"
    assert vars(_parse(cmd.split()[2:])) == vars(args)


def test_run_pretrain_writes_an_hf_dir(tmp_path, capsys):
    out = tmp_path / "pol"
    args = _parse(
        [
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--final-eval-problems",
            "3",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert run_pretrain(args) == 0
    assert "avg@8 =" in capsys.readouterr().out
    record = json.loads((out / "pretrain.json").read_text())
    assert (
        record["command"]
        == f"satrl pretrain --model tiny-arith --steps 2 --seed 0 --batch-size 4 --threads 1 --final-eval-problems 3 --out {out}"
    )
    assert record["steps_run"] == 2 and record["final"]["n_problems"] == 3
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "pretrain.json",
    }
    model, tok = load_policy(out)
    assert model.config.num_hidden_layers == 4 and len(tok) == 52


def test_run_pretrain_in_a_pipe_draws_no_bar(monkeypatch, capsys):
    """stdout not a terminal (a pipe, a log file): no live bar, transformers' bars off, only the final line."""
    from transformers.utils import logging as hf_logging

    from satrl.training import pretrain as trainer  # the handler imports it when it runs (--help does not)

    seen = {}

    def fake(*args, **kwargs):
        seen["progress"], seen["hf_bars"] = kwargs["progress"], hf_logging.is_progress_bar_enabled()
        return {"steps_run": 2, "train_time_s": 1.0, "final": {"avg_at_k": 0.5, "greedy_acc": 0.5}}

    monkeypatch.setattr(trainer, "pretrain", fake)
    hf_logging.enable_progress_bar()
    assert run_pretrain(_parse(["--steps", "2", "--out", "x"])) == 0
    assert seen == {"progress": False, "hf_bars": False} and hf_logging.is_progress_bar_enabled()
    assert capsys.readouterr().out.splitlines() == ["wrote x: 2 steps in 1 s; avg@8 = 0.500, greedy = 0.500"]
