"""`python -m satrl` is the same program as `satrl`: the console script calls :func:`main` here too.

This module imports nothing of its own before :func:`main` runs, so a Ctrl-C while the command's modules import
(:mod:`satrl.cli`'s argparse first, before its own handler is set up) is one line and exit 130, never a traceback
(issue 60). What is left before it is the interpreter's own start-up: a SIGINT there ends the process by the signal,
silently, and ``python -m`` adds the import of runpy, whose failure Python itself reports.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from satrl.cli import main as run
    except KeyboardInterrupt:
        print("satrl: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as satrl.cli.main answers a Ctrl-C
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
