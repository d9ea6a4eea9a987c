"""The weight-sync layer: how each version's weights travel from the trainer to the engine side, once.

A rollout request never carries weights (``satrl.pipeline.engines_host.worker.RolloutRequest``): the loop pushes a version's
weights to the backend once, when the snapshot store keeps it, and tells it which versions it still keeps when
it forgets one; the engine side holds exactly those, and a batch whose version it does not hold fails
(``WeightsMissing``), never silently runs on other weights. The path of a version, all inside this package
below the backend's ``push``:

1. ``transports``: ``weights.transport`` names a registry entry declaring what it needs; its trainer side
   (``trainer_sides``) mirrors the version and sends a typed message (``messages``) onto the request queue, in
   order among the requests;
2. ``inproc``: the message carries the state dict; ``dist`` / ``vllm``: the trainer broadcasts the version as
   buckets in the engine's dtype (``buckets``, gathered from FSDP2 shards one parameter at a time; kept between
   the trainer and the wire as they came, a ``snapshot``) over a two-process gloo group (``link``, ``dist``: raw
   bytes and JSON headers, nothing pickled);
3. ``receivers``: the engine side applies the message to the worker (a ``Holder``): the weights themselves, the
   version the inbox thread received, or a load through vLLM's own weight-transfer API
   (``satrl.engines.vllm_transfer``, which joins the same group inside vLLM's workers); what the worker holds of
   each version is typed (``held``: in memory, a ref into Ray's object store, or in the engine itself).

The layer imports neither the pipeline nor the engines; both import it.
"""
