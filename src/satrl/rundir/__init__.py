"""The run directory (floor 7): :mod:`.files` reads and writes its files (config, logs, checkpoints, summary, the
folder lock) and :mod:`.resume_check` checks a ``--resume``'s config before a file is touched. Above the run
config, below the launch wiring and the loop."""
