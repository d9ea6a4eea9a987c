"""``satrl train``: a policy trained as a run config says, into its run directory (``--resume``: continued).

Bad input (a config, an override, a run folder, a task, a checkpoint) is one line and exit 2; an engine that keeps
dying, a full disk or Ctrl-C end with the ``satrl train --resume`` line that continues the run. The variables earlier
versions read (:data:`LEGACY_ENV`) become overrides here, at the edge, so ``config.yaml`` records them.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from satrl.folders import folder_problem


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. lag.n=8 seed=3 steps=200")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (every key) and exit")


# Environment variables earlier versions read deep inside the run, and the config keys that replace them.
# They still work, turned into overrides here (explicit key=value overrides win), so config.yaml records them.
# End: satrl 0.2.0 drops this table; a variable still set then is refused in one line naming its key.
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
            from satrl.rundir.files import RunDir

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
    from satrl.loop.progress import train_with_progress
    from satrl.models.loading import PolicyLoadError
    from satrl.pipeline.errors import EngineError, RunDirError
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
        print(f"satrl train: {_first_line(err)}; {_again(cfg)}", file=sys.stderr)
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
        print(f"satrl train: disk full ({_first_line(err)}); free space, then {_again(cfg)}", file=sys.stderr)
        return 1
    if summary is None:  # a data-parallel rank other than 0: rank 0 reports
        return 0
    k, late, best = cfg.eval.k, summary.get("late_test_avg_at_k"), summary.get("best_test_avg_at_k")
    print(f"run: {cfg.run_dir()}  late test avg@{k} = {_num(late)}  test avg@{k} at the val-best eval "
          f"(step {summary.get('best_step')}) = {_num(best)}  collapse = {summary.get('collapse_step')}")
    return 0


def _again(cfg) -> str:
    """How to go on after a failure: resume the run, or run the same command again where it failed before its
    first step and so left no run in its folder (orchestrator.train)."""
    if (cfg.run_dir() / "config.yaml").is_file():
        return f"continue with satrl train --resume {cfg.run_dir()}"
    return "run the same command again (the run failed before its first step and left nothing)"


def _too_large(cfg, filename: str | None) -> int:
    """A write stopped by the file-size limit (``ulimit -f``; EFBIG): one line naming the file, exit 2."""
    what = filename or f"a file under {cfg.run_dir()}"
    print(f"satrl train: cannot write {what}: File too large (over the file-size limit, ulimit -f); raise the "
          f"limit, then {_again(cfg)}", file=sys.stderr)  # fmt: skip
    return 2


def _train(cfg, args: argparse.Namespace, train_with_progress) -> dict | None:
    """The run on one process, or this process's part of a data-parallel one when torchrun launched it
    (its WORLD_SIZE/RANK protocol, read here at the edge; None on ranks other than 0)."""
    def run(ctx=None):  # every data-parallel rank runs the loop; rank 0 shows its progress
        shown = not args.no_progress and (ctx is None or ctx.leader)
        return train_with_progress(cfg, resume=bool(args.resume), progress=shown, ctx=ctx)

    from satrl.training.dp import launched

    if not launched():
        return run()
    from satrl.launch.data_parallel import run as run_data_parallel

    return run_data_parallel(cfg, run)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
