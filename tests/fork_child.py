"""The child of the tests' fork servers (tests/doc_runner.py, tests/integrations/verl_main_runner.py): one request
run in a process forked from a server that imported the heavy modules once, ended as its interpreter would end."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable


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
