"""satrl: asynchronous RL post-training of language models with the Staleness-Adaptive Trust Region."""

from satrl import moved as _moved

__version__ = "0.1.0"

_moved.install()  # the old import paths of moved modules (satrl.pipeline.orchestrator, ...) still import
