"""The launch wiring: building the trainer, evaluator and rollout worker from a run's config (:mod:`.setup`) and
running it under ``torchrun`` as data parallel ranks (:mod:`.data_parallel`). The loop imports it; it never imports
the loop."""
