"""verl's Hydra mains run with no cluster, each command in a process of its own, verl imported once.

Run as a script, this file is a small fork server: it imports Ray, verl's ``main_ppo`` and the modules named on its
command line once (what every ``python -m verl...`` command pays first: about 10 s of CPU on 2 cores), prints one
JSON line saying what imported, then reads one command per line on stdin and runs each in a child forked from that
state, as ``python -m MODULE ARGS`` would run it: its own working directory, stdout and stderr, exit code and exit
hooks (satrl's refusal line is printed by one). ``ray.init`` is replaced by an error and
``verl.trainer.main_ppo.run_ppo`` by what verl's TaskRunner does first (``OmegaConf.resolve``), so no cluster
starts: an accepted command prints the ``sat_mu`` the resolver chose. Nothing a command does reaches the next one
(each child starts from the server's state after the imports, and the server runs no command itself).

:class:`VerlMain` is the test side (tests/integrations/test_verl_recipes.py): one server per test module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared child, run as a script too
from fork_child import ForkServer, run_forked, serve  # noqa: E402


class VerlMain:
    """Runs commands through one server process; ``self(argv, cwd)`` returns a CompletedProcess like
    ``subprocess.run([python, "-m", *argv], cwd=cwd, capture_output=True, text=True)`` would."""

    def __init__(self, preload: list[str], timeout: float = 300.0, start_timeout: float = 900.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
        env.update(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONPATH=os.pathsep.join(sys.path))
        # several imports of verl's trainers: minutes on a busy machine
        self.server = ForkServer(__file__, preload, env, timeout, start_timeout, "verl main server")
        self.imports = self.server.imports  # module -> "ok" or the error its import raised

    def __call__(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        return self.server.request({"argv": list(argv)}, cwd, argv)

    def close(self) -> None:
        self.server.close()


# ---- the server (run as a script) ----


def _run_ppo(config, task_runner_class):  # what verl's TaskRunner.run does first, on the driver's config
    from omegaconf import OmegaConf

    OmegaConf.resolve(config)
    print("SATRL_ACCEPTED " + json.dumps({"sat_mu": config.actor_rollout_ref.actor.policy_loss.get("sat_mu")}))


def _no_cluster(*args, **kwargs):
    raise RuntimeError("satrl test: ray.init reached")


def _command(argv: list[str]) -> None:
    """``python -m argv[0] argv[1:]``, in this (forked) process."""
    import runpy

    import verl.trainer.main_ppo as main_ppo

    sys.argv = list(argv)
    if argv[0] == "verl.trainer.main_ppo":  # its Hydra main, called: run as __main__ it would redefine run_ppo
        main_ppo.main()
    else:  # the recipes' mains call main_ppo.run_ppo
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


def _child(case: dict) -> None:
    run_forked(case, lambda c: _command(c["argv"]))


def _serve(preload: list[str]) -> None:
    import importlib

    import ray

    ray.init = _no_cluster
    import verl.trainer.main_ppo as main_ppo

    main_ppo.run_ppo = _run_ppo
    imports = {}
    for name in preload:  # their imports stay loaded; the module itself runs afresh in each command (runpy)
        try:
            importlib.import_module(name)
            imports[name] = "ok"
        except Exception as e:  # reported to the test, which decides
            imports[name] = f"{type(e).__name__}: {e}"
        if name != "verl.trainer.main_ppo":
            sys.modules.pop(name, None)
    try:  # which module verl's registry holds SAT's losses from: the plug-in's entry point, loaded by import verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        imports["sat_loss_modules"] = " ".join(get_policy_loss_fn(m).__module__ for m in ("sat", "sat_gspo"))
    except Exception as e:
        imports["sat_loss_modules"] = f"{type(e).__name__}: {e}"
    serve(imports, _child)


if __name__ == "__main__":
    _serve(sys.argv[1:])
