"""The training loop (floor 9): :mod:`.orchestrator` (``train(cfg)``, the order of things top to bottom),
:mod:`.rollouts` (the lag schedule, the snapshots pending batches need, the backend) and :mod:`.progress` (the bar
or plain lines a run prints). It imports the launch wiring below it; nothing of the library imports it."""
