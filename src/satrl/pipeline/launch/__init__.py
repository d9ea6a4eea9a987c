"""The launch wiring: building the trainer, evaluator and rollout worker from a run's config (:mod:`.setup`) and
running it under ``torchrun`` as data parallel ranks (:mod:`.data_parallel`: rank 0 runs the loop and tells the others
what only it knows; they follow it). The loop imports it; it never imports the loop."""
