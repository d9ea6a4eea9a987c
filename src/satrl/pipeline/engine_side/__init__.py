"""The engine-process side of the loop: where rollout workers run (:mod:`.backends`: in-process, a child process
whose loop and typed messages are :mod:`.engine_process`, Ray actors in :mod:`.ray_backend`) and the worker that
turns a request into samples (:mod:`.worker`). It imports nothing of the loop but its leaves
(``pipeline.errors``, ``pipeline.schedules``)."""
