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

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fork_child import run_forked, serve


class DocRunner:
    """``self.satrl(argv, cwd)`` and ``self.python(code, cwd)`` return a CompletedProcess like ``subprocess.run``
    of ``satrl *argv`` / ``python -c code`` with ``capture_output=True, text=True`` would; the server runs in
    ``env`` (which every child keeps)."""

    def __init__(self, preload: list[str], env: dict[str, str], timeout: float = 600.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="doc_runner_"))
        self.log = (self.dir / "server.err").open("w")
        self.timeout, self.n = timeout, 0
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=self.dir)
        self.imports: dict[str, str] = self._reply(600)  # module -> "ok" or the error its import raised

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            err = (self.dir / "server.err").read_text()[-3000:]
            self.close()
            raise RuntimeError(f"doc runner: no answer in {timeout:.0f} s: {err}")
        return json.loads(line)

    def _run(self, case: dict, cwd: Path) -> subprocess.CompletedProcess:
        self.n += 1
        out, err = self.dir / f"{self.n}.out", self.dir / f"{self.n}.err"
        case.update(cwd=str(cwd), stdout=str(out), stderr=str(err), timeout=self.timeout)
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        code = self._reply(self.timeout + 60)["returncode"]  # the child's own alarm comes first
        return subprocess.CompletedProcess(case.get("argv", "python -c"), code, out.read_text(), err.read_text())

    def satrl(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        return self._run({"argv": list(argv)}, cwd)

    def python(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        return self._run({"code": code}, cwd)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the server leaves its loop and exits
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # stuck (e.g. a command past its timeout): ours to stop
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


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
