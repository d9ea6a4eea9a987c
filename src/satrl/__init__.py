"""satrl: asynchronous RL post-training of language models with the Staleness-Adaptive Trust Region."""

__version__ = "0.1.0"

