"""The engine-process side of the loop: where rollout workers run (:mod:`.backends`, the registry naming them:
in-process or a child process in :mod:`.local_backends`, the child's loop and typed messages :mod:`.engine_process`,
Ray actors in :mod:`.ray_backend`) and the worker that
turns a request into samples (:mod:`.worker`). It imports nothing of the loop but its leaves
(``pipeline.errors``, ``pipeline.schedules``)."""
