"""benchmarks/cli_startup.py runs every case it times and ends each with the exit code it expects."""

from benchmarks import cli_startup
from benchmarks._report import DOC

from satrl import cli


def test_it_times_every_command():
    assert cli_startup.COMMANDS == tuple(cli.COMMANDS)


def test_one_round_runs_and_writes_nothing(capsys):
    before = DOC.read_text()
    assert cli_startup.main(["--repeats", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert len(cli_startup.CASES) == 2 + len(cli.COMMANDS) + 3
    assert all(f"| {what} |" in out for what, _, _ in cli_startup.CASES)
    assert DOC.read_text() == before
