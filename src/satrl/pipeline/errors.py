"""The pipeline's errors that reach the user as one line (``satrl train`` exits 2 on them): a leaf module, so
that the modules raising them and the command line that reports them import it and not each other."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine process failed (died or hung) more often in a row than allowed: one line for the user, who
    can continue the run with ``satrl train --resume`` from its last checkpoint."""


class RunDirError(ValueError):
    """A run directory that must not be written, resumed or summarized as it is: one line naming the folder
    or file:line and how to go on (``satrl train`` exits 2)."""
