"""The engines host (formerly ``pipeline/engine_side/``, an alias that still imports): where rollout workers and
their engines run (:mod:`.backends`, the registry naming them: in-process or a child process in
:mod:`.local_backends`, the child's loop and typed messages :mod:`.engine_process`, Ray actors in
:mod:`.ray_backend`) and the worker that turns a request into samples (:mod:`.worker`). A weight version's path
is two functions here: the backend's ``push`` (trainer side) and ``RolloutWorker.receive`` (engine side). It
imports nothing of the loop but its leaves (``pipeline.errors``, ``pipeline.schedules``)."""
