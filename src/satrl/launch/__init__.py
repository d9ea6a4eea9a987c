"""The launch wiring: building the trainer, run directory, evaluator and rollout worker from a run's config
(:mod:`.setup`) and running it under ``torchrun`` as data parallel ranks (:mod:`.data_parallel`: every rank runs the
loop, rank 0 tells the others what only it knows, and their run directory, rollouts and evaluator are
:mod:`.stand_ins`). The loop imports it; it never imports the loop."""
