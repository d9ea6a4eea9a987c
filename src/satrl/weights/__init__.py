"""The weight-sync layer: the values a version's weights travel as, the wire they travel on, and the messages
that order them, from the trainer to the engine side, once per version.

A rollout request never carries weights (``satrl.pipeline.engines_host.worker.RolloutRequest``): the loop pushes a
version's weights to the backend once, when the snapshot store keeps it, and tells it which versions it still
keeps when it forgets one; the engine side holds exactly those, and a batch whose version it does not hold fails
(``WeightsMissing``), never silently runs on other weights. What happens to a version is written top to bottom
in two places (docs/architecture.md, "The path of one weight version"): the backend's ``push`` on the trainer
side (``engines_host.local_backends.ProcessBackend.push``) and ``RolloutWorker.receive`` on the engine side. This
package gives them their parts:

- ``snapshot``: a version as the trainer side keeps it (a :class:`~satrl.weights.snapshot.Snapshot`: buckets or
  a full state dict), and the store of the versions pending batches need;
- ``buckets``: the trainer's weights as buckets in the engine's dtype, gathered from FSDP2 shards one parameter
  at a time;
- ``link``: the ``dist``/``vllm`` wire (a two-process gloo group between the trainer and the engine process, raw
  bytes and JSON headers, nothing pickled) and the engine side's inbox that receives it;
- ``messages``: what the request queue carries of a version (``Put``, ``Take``, ``Load``, ``Keep``);
- ``transports``: the registry where ``weights.transport`` names a transport and declares what it needs.

The layer imports neither the pipeline nor the engines; both import it.
"""
