"""The tests' fork servers (tests/doc_runner.py, tests/integrations/verl_main_runner.py), both sides: the test's
:class:`ForkServer` starts the server script and sends it requests; the server (:func:`serve`) forks a child per
request from the state its heavy imports left, and :func:`run_forked` ends that child as its interpreter would."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def run_forked(case: dict, command: Callable[[dict], int | None]) -> None:
    """Runs ``command(case)`` in this forked child and exits as its interpreter would: exit code, then the exit
    hooks. ``case`` gives its ``cwd``, ``stdout`` and ``stderr`` files and ``timeout``. Never returns."""
    import atexit
    import signal
    import traceback

    signal.alarm(int(case["timeout"]))  # a command that hangs dies (SIGALRM), as subprocess.run's timeout kills it
    if "coverage" in sys.modules:  # under `make coverage`: this child's lines to a data file of its own (its patch=fork)
        restart = getattr(sys.modules["coverage"].control, "_after_fork_in_child", None)
        if restart is not None:
            restart()
    os.chdir(case["cwd"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, case["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        os.dup2(os.open(path, flags), fd)
    code = 0
    try:
        code = command(case)
    except SystemExit as e:
        code = e.code
        if code is not None and not isinstance(code, int):  # as the interpreter does with sys.exit("message")
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def serve(imports: dict[str, str], child: Callable[[dict], None]) -> None:
    """The server's loop: say what imported (one JSON line), then fork ``child(case)`` for each request read from
    stdin (one JSON line each) and answer its exit code, until stdin closes."""
    print(json.dumps(imports), flush=True)
    for line in sys.stdin:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(json.loads(line))
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


class ForkServer:
    """The test side: runs ``python SCRIPT *preload`` (a server calling :func:`serve`) in ``env``; ``imports`` is
    its first line (module -> "ok" or the error its import raised); :meth:`request` runs one case in a fresh child."""

    def __init__(self, script: str, preload: list[str], env: dict[str, str], timeout: float, start_timeout: float,
                 name: str) -> None:  # fmt: skip
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name.replace(' ', '_')}_"))
        self.log = (self.dir / "server.err").open("w")
        self.timeout, self.n, self.name = timeout, 0, name
        self.proc = subprocess.Popen([sys.executable, script, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=self.dir)
        self.imports: dict[str, str] = self._reply(start_timeout)

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            err = (self.dir / "server.err").read_text()[-3000:]
            self.close()
            raise RuntimeError(f"{self.name}: no answer in {timeout:.0f} s: {err}")
        return json.loads(line)

    def request(self, case: dict, cwd: Path, args) -> subprocess.CompletedProcess:
        """Runs ``case`` (with ``cwd``; its output files and timeout added here); a CompletedProcess named ``args``."""
        self.n += 1
        out, err = self.dir / f"{self.n}.out", self.dir / f"{self.n}.err"
        case = {**case, "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": self.timeout}
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        code = self._reply(self.timeout + 60)["returncode"]  # the child's own alarm comes first
        return subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())

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
