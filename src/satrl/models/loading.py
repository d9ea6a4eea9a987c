"""Load a policy: a local Hugging Face causal-LM directory or a built-in name.

Built-ins ship inside the package as ordinary HF directories under ``satrl/models/checkpoints/<name>/``
(config.json, model.safetensors, tokenizer files, pretrain.json with the command that regenerates them).
Weights load from safetensors only: a directory holding only ``pytorch_model.bin`` is refused, because
unpickling a checkpoint can run arbitrary code. For the same reason a folder that asks for its own code
(``auto_map`` in config.json or tokenizer_config.json) is refused, and every load passes
``trust_remote_code=False``: transformers never asks on stdin whether to run it. Loading is quiet: transformers'
and huggingface_hub's progress bars ("Loading weights: 100%|...") are off while it runs (:func:`quiet_progress_bars`).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from satrl.models.builtins import BUILTINS, CHECKPOINTS
from satrl.registry import UnknownChoice

EXPECTED = "a Hugging Face causal-LM directory with config.json, *.safetensors weights and tokenizer files"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_restore = (False, False)


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Turn off transformers' and huggingface_hub's tqdm progress bars inside the block (they print
    "Loading weights: 100%|..." to stderr at every model load, one line per engine start in a log file).
    The outermost of nested or concurrent blocks restores the settings found on entry."""
    global _quiet_depth, _quiet_restore
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_restore = (hf_logging.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled())
            hf_logging.disable_progress_bar()  # also disables huggingface_hub's bars
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                transformers_on, hub_on = _quiet_restore
                if transformers_on:
                    hf_logging.enable_progress_bar()  # also touches huggingface_hub's: set those next
                (hub_utils.enable_progress_bars if hub_on else hub_utils.disable_progress_bars)()


class PolicyLoadError(ValueError):
    """A policy path or name that cannot be loaded; the message names the path and what was expected."""


def builtin_path(name: str) -> Path:
    """Directory of a built-in policy; ``ValueError`` listing the valid names if ``name`` is unknown."""
    try:
        return CHECKPOINTS / BUILTINS.get(name)
    except UnknownChoice as e:
        raise PolicyLoadError(str(e)) from None


def resolve_policy_path(path_or_name: str | Path) -> Path:
    """A built-in name's shipped directory, or the given path after checking it looks like an HF
    causal-LM directory (one-line :class:`PolicyLoadError` otherwise)."""
    if str(path_or_name) in BUILTINS:
        path = builtin_path(str(path_or_name))
        if not (path / "config.json").is_file():
            raise PolicyLoadError(
                f"built-in policy {path_or_name!r} is not in this install ({path} has no config.json); "
                f"reinstall satrl or regenerate it: satrl pretrain --model {path_or_name} --steps N --out {path}"
            )
    else:
        path = Path(path_or_name).expanduser()
    if not path.exists():
        hint = "" if ("/" in str(path_or_name) or path.suffix) else f" (built-in names: {sorted(BUILTINS)})"
        raise PolicyLoadError(f"policy path {str(path)!r} does not exist; expected {EXPECTED}{hint}")
    if not path.is_dir():
        raise PolicyLoadError(f"policy path {str(path)!r} is not a directory; expected {EXPECTED}")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        bins = sorted(p.name for p in path.glob("*.bin"))
        if bins:
            raise PolicyLoadError(
                f"policy path {str(path)!r} has only pickled weights ({', '.join(bins)}); satrl loads "
                f"safetensors only: convert with model.save_pretrained(dir, safe_serialization=True)"
            )
        missing.append("*.safetensors")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json or tokenizer_config.json)")
    if missing:
        raise PolicyLoadError(f"policy path {str(path)!r} lacks {', '.join(missing)}; expected {EXPECTED}")
    for name in ("config.json", "tokenizer_config.json"):
        if "auto_map" in _json_keys(path / name):
            raise PolicyLoadError(f"policy path {str(path)!r} asks to run its own code (auto_map in {name}); satrl "
                                  "never runs code from a model folder (trust_remote_code=False)")  # fmt: skip
    return path


def _json_keys(file: Path) -> set[str]:
    """The top-level keys of the JSON object in ``file``; none if it is missing or not one (loading says why)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _loaded(what: str, path: Path, load):
    """Run ``load()``; malformed config/weights/tokenizer files become the one-line PolicyLoadError."""
    try:
        with quiet_progress_bars():
            return load()
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PolicyLoadError(f"cannot load {what} from {str(path)!r} ({first}); expected {EXPECTED}") from e


def load_model(path_or_name: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM of a built-in policy or local HF directory, in eval mode, on CPU, in ``dtype``; never
    downloads anything. Hub kernels off (``use_kernels=False``): transformers >= 5.2x turns them on by default
    where the ``kernels`` package is installed, which would swap layers for downloaded kernels (or their
    fallbacks, depending on the network), and re-kernelize on every ``train()``/``eval()``, which fails on the
    meta copies data parallel builds. The trainer's numerics are the model's own torch code everywhere."""
    path = resolve_policy_path(path_or_name)
    model = _loaded("the policy", path, lambda: AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, use_safetensors=True, local_files_only=True, attn_implementation="sdpa",
        use_kernels=False, trust_remote_code=False))  # fmt: skip
    return model.eval()


def empty_model(path_or_name: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM of a built-in policy or local HF directory with every parameter and buffer on the meta
    device: its config is read, its weights are not, and it takes no memory. A data-parallel rank other than
    0 builds its policy this way; the trainer allocates its shards and fills them from rank 0's weights."""
    path = resolve_policy_path(path_or_name)
    config = _loaded("the config", path, lambda: AutoConfig.from_pretrained(
        path, local_files_only=True, trust_remote_code=False))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with every parameter and buffer new on the meta device: no bytes, ties kept
    (deepcopy's memo maps each tensor to its one copy, where ``Module.to("meta")`` would untie them)."""
    memo: dict = {}
    for t in [*module.parameters(), *module.buffers()]:
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(empty, t.requires_grad) if isinstance(t, torch.nn.Parameter) else empty
    return copy.deepcopy(module, memo)


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a built-in policy or local HF directory, without loading the weights (engines
    that load the checkpoint themselves, like vLLM, need only this)."""
    path = resolve_policy_path(path_or_name)
    return _loaded("the tokenizer", path, lambda: AutoTokenizer.from_pretrained(
        path, local_files_only=True, trust_remote_code=False))


def load_policy(
    path_or_name: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a built-in name (``tiny-arith``, ``tiny-arith-moe``) or a local HF
    causal-LM directory. The model is in eval mode, on CPU, in ``dtype``; never downloads anything."""
    return load_model(path_or_name, dtype), load_tokenizer(path_or_name)
