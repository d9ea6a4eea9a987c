"""The docs' commands and snippets, each in a process of its own, the heavy imports paid once.

Run as a script, this file is a small fork server (as tests/integrations/verl_main_runner.py is for verl): it
imports the modules named on its command line (satrl's command line, TRL: what each ``satrl ...`` or TRL snippet
pays first, ~4 s and ~8 s of CPU on 2 cores), without running anything (no torch threads, so forking is safe),
prints one JSON line saying what imported, then reads one request per line on stdin and runs each in a child
forked from that state: a ``satrl ARGV`` command through the console script's entry point
(``satrl.__main__.main``), or a python snippet as ``python -c CODE`` runs it (``__main__``, ``sys.argv == ["-c"]``, the
working directory first on ``sys.path``). Each child has its own working directory, stdout and stderr, exit code
and exit hooks; nothing one does reaches the next (each starts from the server's state after the imports).

:class:`DocRunner` is the test side (tests/test_doc_snippets.py): one server per test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fork_child import ForkServer, run_forked, serve


class DocRunner:
    """``self.satrl(argv, cwd)`` and ``self.python(code, cwd)`` return a CompletedProcess like ``subprocess.run``
    of ``satrl *argv`` / ``python -c code`` with ``capture_output=True, text=True`` would; the server runs in
    ``env`` (which every child keeps)."""

    def __init__(self, preload: list[str], env: dict[str, str], timeout: float = 600.0) -> None:
        self.server = ForkServer(__file__, preload, env, timeout, 600, "doc runner")
        self.imports = self.server.imports  # module -> "ok" or the error its import raised

    def satrl(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        return self.server.request({"argv": list(argv)}, cwd, list(argv))

    def python(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        return self.server.request({"code": code}, cwd, "python -c")

    def close(self) -> None:
        self.server.close()


# ---- the server (run as a script) ----


def _command(case: dict) -> int | None:
    """``satrl *argv`` (the console script's ``satrl.__main__:main``) or ``python -c code``, in this (forked)
    process."""
    if "argv" in case:
        from satrl.__main__ import main

        sys.argv, sys.path[0] = ["satrl", *case["argv"]], os.path.dirname(sys.executable)
        return main(case["argv"])
    sys.argv, sys.path[0] = ["-c"], ""
    exec(compile(case["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    return 0


def _child(case: dict) -> None:
    run_forked(case, _command)


def _serve(preload: list[str]) -> None:
    import importlib

    imports = {}
    for name in preload:
        try:
            importlib.import_module(name)
            imports[name] = "ok"
        except Exception as e:  # reported to the test; a child that needs it imports it again and fails as printed
            imports[name] = f"{type(e).__name__}: {e}"
    serve(imports, _child)


if __name__ == "__main__":
    _serve(sys.argv[1:])
