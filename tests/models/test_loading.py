"""load_policy: local HF directories, built-in names, and its one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from satrl.models import BUILTINS, PolicyLoadError, build_char_tokenizer, build_tiny_model, load_policy


def _save_tiny(path, kind="dense"):
    tok = build_char_tokenizer()
    model = build_tiny_model(kind, vocab_size=len(tok), seed=1, num_hidden_layers=2)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_round_trip_through_a_saved_dir(tmp_path, kind):
    model, tok = _save_tiny(tmp_path, kind)
    loaded, loaded_tok = load_policy(str(tmp_path))
    assert type(loaded) is type(model) and not loaded.training
    x = torch.tensor([tok("123+456=")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=x).logits, model(input_ids=x).logits, atol=0, rtol=0)
    assert loaded_tok("9-3=")["input_ids"] == tok("9-3=")["input_ids"]
    # the same directory is an ordinary HF checkpoint
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(plain.lm_head.weight, model.lm_head.weight)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtins_load(name):
    model, tok = load_policy(name)
    assert model.config.vocab_size == len(tok) == 52
    assert (tok.eos_token_id, tok.pad_token_id) == (1, 0)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_dir(tmp_path):
    path = tmp_path / "nope"
    with pytest.raises(PolicyLoadError) as err:
        load_policy(str(path))
    msg = _one_line(err)
    assert str(path) in msg and "config.json" in msg and "safetensors" in msg
    assert isinstance(err.value, ValueError)


def test_unknown_name_lists_builtins():
    with pytest.raises(PolicyLoadError) as err:
        load_policy("tiny-arth")
    msg = _one_line(err)
    assert "tiny-arth" in msg and "tiny-arith" in msg and "tiny-arith-moe" in msg


def test_dir_with_only_pickled_weights_is_refused(tmp_path):
    model, _ = _save_tiny(tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(PolicyLoadError) as err:
        load_policy(tmp_path)
    msg = _one_line(err)
    assert str(tmp_path) in msg and "pytorch_model.bin" in msg and "safetensors only" in msg


def test_dir_missing_config_and_tokenizer(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(PolicyLoadError) as err:
        load_policy(tmp_path)
    msg = _one_line(err)
    assert "config.json" in msg and "tokenizer" in msg and str(tmp_path) in msg


def test_malformed_config_is_one_line(tmp_path):
    _save_tiny(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    with pytest.raises(PolicyLoadError) as err:
        load_policy(tmp_path)
    assert str(tmp_path) in _one_line(err)


def test_file_instead_of_dir(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(PolicyLoadError, match="not a directory"):
        load_policy(f)


def test_loading_prints_no_progress_bar_and_restores_the_setting(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    from satrl.models import load_model, quiet_progress_bars

    _save_tiny(tmp_path)
    hf_logging.enable_progress_bar()
    AutoModelForCausalLM.from_pretrained(tmp_path)  # control: transformers itself draws a bar
    assert "Loading weights" in capfd.readouterr().err
    load_model(str(tmp_path))
    assert capfd.readouterr().err == "" and hf_logging.is_progress_bar_enabled()
    with quiet_progress_bars():
        with quiet_progress_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # an inner block does not restore early
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with quiet_progress_bars():
        pass
    assert not hf_logging.is_progress_bar_enabled()  # off before stays off
    hf_logging.enable_progress_bar()


def test_loaded_policy_runs_without_hub_kernels_and_its_meta_copy_switches_modes():
    """transformers >= 5.2x turns hub kernels on by default where `kernels` is installed; a loaded policy must
    not use them (its numerics would depend on the network), and its meta copy (data parallel's reference)
    must switch train/eval: with kernels on, `eval()` re-kernelizes and refuses the meta device. Found when a
    fresh install pulled transformers 5.25 and every torchrun job hung at start."""
    from satrl.models import load_model, meta_copy

    model = load_model("tiny-arith-moe")
    assert not getattr(model, "use_kernels", False)
    copy = meta_copy(model.float().train())
    copy.to(torch.float32).eval()  # raised "Unsupported device type 'meta'" with kernels on
    assert not copy.training
