"""``satrl export RUN_DIR OUT [--step N]``: a run's checkpoint as a Hugging Face causal-LM folder.

OUT gets what ``transformers.AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` read
(config.json, generation_config.json, model.safetensors, the tokenizer files) and ``satrl_export.json`` (where
it came from, and the ``satrl eval`` flags that score it as the run's own evaluator did). The architecture,
tokenizer and generation config are the run's base policy's (``model.path``, or the built-in ``model.name``, of
its config.yaml); the weights are the checkpoint's ``model.safetensors`` in the trainer's fp32, bit for bit:
checked against the sha256 the checkpoint recorded before they are read, and against the checkpoint again
once they are in the model, before anything is written. A data-parallel checkpoint is read the same way: its
``model.safetensors`` holds the full weights gathered from the shards (:mod:`satrl.apps.runs`).

Nothing is written into RUN_DIR. OUT must be new or an empty folder; it is written under a temporary name
beside it and renamed into place, so a failed export leaves no half folder. Bad input (no run, no checkpoint,
an unknown step, OUT not empty or inside the run) is one line naming the path, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from satrl.apps.runs import RunReadError, checkpoint_of, checkpoint_step, checkpoint_weights, run_config
from satrl.folders import os_error_of, usual_modes

if TYPE_CHECKING:  # imported where used: `satrl export --help` loads no torch
    import torch

INFO = "satrl_export.json"


def add_export_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (satrl train's out=)")
    parser.add_argument("out", metavar="OUT", help="the Hugging Face folder to write (new, or an empty folder)")
    parser.add_argument("--step", type=int, help="the checkpoint of this optimizer step (default: the latest; a run "
                        "keeps its latest and the one checkpoints/best names)")  # fmt: skip


def check_out(run: Path, out: Path) -> None:
    """Refuse an OUT that holds anything, is not a folder (a link to one included), or lies inside the run (never
    written into)."""
    if out.resolve().is_relative_to(run.resolve()):
        raise RunReadError(f"{out}: inside the run directory {run}, which export never writes into; choose "
                           "an OUT outside it")  # fmt: skip
    if out.is_symlink():  # the export is renamed into OUT's place, which a link is not (it said "Not a directory")
        raise RunReadError(f"{out}: a symbolic link (to {os.readlink(out)}); export writes a new folder in its "
                           f"place: give the folder itself ({out.resolve()}) or a new OUT")  # fmt: skip
    if out.exists() and not out.is_dir():
        raise RunReadError(f"{out}: exists and is not a folder; choose a new OUT")
    if out.is_dir() and any(out.iterdir()):
        raise RunReadError(f"{out}: exists and is not empty; export writes only into a new or empty folder")


def policy_with(source: str, weights: dict[str, torch.Tensor], where: Path) -> torch.nn.Module:
    """The base policy's architecture (from ``source``'s config, no weights read) holding ``weights``, which must
    be exactly its parameters and persistent buffers; a mismatch is a RunReadError naming the checkpoint."""
    import torch

    from satrl.models.loading import empty_model

    model = empty_model(source)
    try:
        model.load_state_dict(weights, strict=True, assign=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise RunReadError(f"{where}: its weights do not fit the run's model {source!r} ({first})") from None
    model.tie_weights()  # loading untied the LM head from the embeddings: tie them as the architecture says
    state = model.state_dict()
    differ = [k for k, v in weights.items() if not torch.equal(state[k], v)]  # a tie that dropped a trained copy
    if differ:
        raise RunReadError(f"{where}: {differ[0]} differs from the tensor the architecture ties it to; not a "
                           f"checkpoint of {source!r}")  # fmt: skip
    return model


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> tuple[Path, dict]:
    """Write the checkpoint of ``run_dir`` at ``step`` (None: the latest) to the HF folder ``out``; returns the
    checkpoint folder and what ``satrl_export.json`` records."""
    from transformers import GenerationConfig

    from satrl.apps.eval import EvalSettings
    from satrl.models.loading import load_tokenizer, quiet_progress_bars, resolve_policy_path

    run, out = Path(run_dir), Path(out)
    cfg = run_config(run, step)
    check_out(run, out)
    ckpt = checkpoint_of(run, step)
    source = cfg.model.source
    tokenizer = load_tokenizer(source)  # a missing model.path fails here, before the weights are read
    model = policy_with(source, checkpoint_weights(ckpt), ckpt)
    base = resolve_policy_path(source)
    if (base / "generation_config.json").is_file():  # the base's sampling defaults, not ones derived anew
        model.generation_config = GenerationConfig.from_pretrained(base, local_files_only=True)
    info = {"run": str(run.resolve()), "checkpoint": ckpt.name, "step": checkpoint_step(ckpt), "model": source,
            "dtype": "float32", "eval_flags": EvalSettings.of_run(cfg).flags()}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with quiet_progress_bars():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=1) + "\n")
        usual_modes(tmp)
        if out.is_dir():
            out.rmdir()  # empty (checked): the rename needs the name free
        os.replace(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        wrapped = None if isinstance(err, OSError) else os_error_of(err, str(out))  # safetensors' full disk
        if wrapped is not None:
            raise wrapped from err
        raise
    return ckpt, info


def run_export(args: argparse.Namespace) -> int:
    """Handler of ``satrl export``: 0 and two lines (what was written, how to evaluate it), or 2 and one line."""
    from satrl.models.loading import PolicyLoadError

    try:
        ckpt, info = export(args.run_dir, args.out, args.step)
    except (RunReadError, PolicyLoadError) as err:
        print(f"satrl export: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as err:  # OUT in a read-only place, under a file, a full disk: nothing was left behind
        print(f"satrl export: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(f"exported {ckpt} (step {info['step']}) to {args.out}")
    print(f"score it as the run did: satrl eval --model {shlex.quote(str(args.out))} {shlex.join(info['eval_flags'])}")
    return 0
