"""``satrl`` command line: train | eval | export | pretrain | grid | report | demo.

Each subcommand's arguments and handler live next to the code they drive; this file only wires them.
Modules are imported lazily, so ``satrl --help`` is instant. A subcommand's flags and positionals (e.g.
``train``'s ``key=value`` overrides) mix in any order: ``satrl train grpo.yaml --no-progress steps=8``.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

# subcommand -> (module, help). The module defines add_<cmd>_args(parser) and run_<cmd>(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("satrl.cli", "train a policy: satrl train [CONFIG.yaml] [key=value ...] [--resume RUN_DIR]"),
    "eval": ("satrl.eval_cli", "avg@k and greedy accuracy of a policy or a run's checkpoint on a task"),
    "export": ("satrl.export", "a run's checkpoint as a Hugging Face folder: satrl export RUN_DIR OUT [--step N]"),
    "pretrain": ("satrl.training.pretrain", "supervised base policy for a built-in model"),
    "grid": ("satrl.experiments.grid", "run a grid of configs x lags x seeds, resumably"),
    "report": ("satrl.experiments.report", "tables with 95% CIs and figures for a grid's runs"),
    "demo": ("satrl.demo", "SAT-GRPO vs GRPO at broadcast lag 8 on the built-in task, with a report"),
}


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. lag.n=8 seed=3 steps=200")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (every key) and exit")


# Environment variables earlier versions read deep inside the run, and the config keys that replace them.
# They still work, turned into overrides here (explicit key=value overrides win), so config.yaml records them.
LEGACY_ENV = {
    "SATRL_TORCH_THREADS": "train.max_threads",
    "SATRL_RAY_WORKERS": "ray.workers",
    "SATRL_RAY_ADDRESS": "ray.address",
    "RAY_ADDRESS": "ray.address",  # Ray's own (set by `ray job submit`); SATRL_RAY_ADDRESS wins
    "SATRL_RAY_GPUS": "ray.gpus",
}


# OSError numbers that mean "this path cannot be used" (the user's out= or run directory): one line, exit 2.
UNUSABLE_PATH = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP}


def legacy_env_overrides(environ=None) -> list[str]:
    """``key=value`` overrides for the :data:`LEGACY_ENV` variables that are set, each noted on stderr."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for var, key in LEGACY_ENV.items():
        if environ.get(var) and key not in out:
            out[key] = f"{key}={environ[var]}"
            print(f"satrl train: {var}={environ[var]} taken as {key}={environ[var]} (set {key} instead)",
                  file=sys.stderr)  # fmt: skip
    return list(out.values())


def run_train(args: argparse.Namespace) -> int:
    from satrl.config import ConfigError, check_before_run, load_config

    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:  # `satrl train key=value ...` without a file
        config, overrides = None, [config, *overrides]
    if args.resume and config is not None:  # it was ignored without a word (issue 46)
        print(f"satrl train: --resume {args.resume} takes the run folder's own config ({args.resume}/config.yaml) "
              f"and key=value overrides only; drop {config}", file=sys.stderr)  # fmt: skip
        return 2
    overrides = [*legacy_env_overrides(), *overrides]
    try:
        if args.resume:
            from satrl.pipeline.rundir import RunDir

            cfg = RunDir.config_of(args.resume, overrides)
        else:
            cfg = load_config(config, overrides)
    except ConfigError as err:
        print(f"satrl train: {_first_line(err)}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    where = args.resume or cfg.run_dir()
    try:
        check_before_run(cfg)  # the torch engines' arguments, and the devices on this machine
    except ConfigError as err:
        print(f"satrl train: {_first_line(err)}", file=sys.stderr)
        return 2
    if not args.resume and (why := folder_problem(cfg.run_dir())):
        print(f"satrl train: out={cfg.out or cfg.run_dir()}: {why}", file=sys.stderr)
        return 2
    try:
        return _run_train(cfg, args)
    except KeyboardInterrupt:  # Ctrl-C: the checkpoints written so far are intact
        print(f"satrl train: interrupted; continue with satrl train --resume {where}", file=sys.stderr)
        return 130


def _run_train(cfg, args: argparse.Namespace) -> int:
    from satrl.config import ConfigError
    from satrl.models.loading import PolicyLoadError
    from satrl.pipeline.errors import EngineError, RunDirError
    from satrl.pipeline.progress import train_with_progress
    from satrl.tasks import TaskError
    from satrl.training.checkpoint import CheckpointError
    from satrl.types import ContextLengthError

    bad_input = (TaskError, PolicyLoadError, CheckpointError, FileExistsError, ConfigError, ContextLengthError,
                 RunDirError)
    try:
        summary = _train(cfg, args, train_with_progress)
    except bad_input as err:  # bad input: one line, exit 2
        print(f"satrl train: {_first_line(err)}", file=sys.stderr)
        return 2
    except EngineError as err:  # the engine keeps dying or hanging: the checkpoints are intact
        print(f"satrl train: {_first_line(err)}; continue with satrl train --resume {cfg.run_dir()}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno == errno.EFBIG:  # checkpoint.save_checkpoint names the checkpoint a safetensors write was in
            return _too_large(cfg, err.filename)
        if err.errno in UNUSABLE_PATH and err.filename:  # e.g. out= under a file, or in a read-only place
            print(f"satrl train: cannot write {err.filename}: {err.strerror} (check out= / the run directory)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"satrl train: disk full ({_first_line(err)}); free space, then continue with "
              f"satrl train --resume {cfg.run_dir()}", file=sys.stderr)  # fmt: skip
        return 1
    if summary is None:  # a data-parallel rank other than 0: rank 0 reports
        return 0
    k, late, best = cfg.eval.k, summary.get("late_test_avg_at_k"), summary.get("best_test_avg_at_k")
    print(f"run: {cfg.run_dir()}  late test avg@{k} = {_num(late)}  test avg@{k} at the val-best eval "
          f"(step {summary.get('best_step')}) = {_num(best)}  collapse = {summary.get('collapse_step')}")
    return 0


def folder_problem(path) -> str | None:
    """Why ``path`` cannot be (or become) a folder: it, or a folder above it, exists and is not a folder (a file,
    ``/dev/null``); None if it can, as far as that goes (permissions are met when it is written)."""
    from pathlib import Path

    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if p.is_dir():
                return None
            return f"{p} exists and is not a folder" + ("" if p == path else f", so {path} cannot be one")
    return None


def _too_large(cfg, filename: str | None) -> int:
    """A write stopped by the file-size limit (``ulimit -f``; EFBIG): one line naming the file, exit 2."""
    what = filename or f"a file under {cfg.run_dir()}"
    print(f"satrl train: cannot write {what}: File too large (over the file-size limit, ulimit -f); raise the "
          f"limit, then continue with satrl train --resume {cfg.run_dir()}", file=sys.stderr)  # fmt: skip
    return 2


def _train(cfg, args: argparse.Namespace, train_with_progress) -> dict | None:
    """The run on one process, or this process's part of a data-parallel one when torchrun launched it
    (its WORLD_SIZE/RANK protocol, read here at the edge; None on ranks other than 0)."""
    run = lambda: train_with_progress(cfg, resume=bool(args.resume), progress=not args.no_progress)  # noqa: E731
    from satrl.training.dp import launched

    if not launched():
        return run()
    from satrl.pipeline.launch.data_parallel import run as run_data_parallel

    return run_data_parallel(cfg, run)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def version_line() -> str:
    """``satrl <version> (distribution satrl-async, commit <sha>[+dirty])``: from git in a checkout, from the build
    record in an installed wheel (``provenance.git_commit``)."""
    from satrl import __version__
    from satrl.provenance import git_commit

    commit = git_commit()
    return f"satrl {__version__} (distribution satrl-async{f', commit {commit}' if commit else ''})"


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser | None]:
    """The top-level parser, and the subparser of ``command`` with its arguments (None if ``command`` is not
    one of :data:`COMMANDS`). Only that command's module is imported."""
    parser = argparse.ArgumentParser(prog="satrl", description=__doc__.splitlines()[0].replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # --version unwrapped
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None
    for name, (module, help_text) in COMMANDS.items():
        # argparse %-formats help strings (not descriptions): a literal % must be doubled there
        p = sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text)
        if name == command:  # import only the module of the command being run
            getattr(importlib.import_module(module), f"add_{name}_args")(p)
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
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(getattr(module, f"run_{args.command}")(args) or 0)
    except BrokenPipeError:  # `satrl grid ... --dry-run | head`: the reader left; stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the signal
    except KeyboardInterrupt:  # Ctrl-C where the command has no more to say (satrl train names its --resume)
        print(f"satrl {args.command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT


if __name__ == "__main__":
    raise SystemExit(main())
