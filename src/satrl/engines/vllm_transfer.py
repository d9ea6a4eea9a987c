"""satrl's bucket wire as a vLLM weight-transfer engine (``weights.transport=vllm``), loaded inside vLLM's workers.

vLLM (>= 0.32) updates a running model through its weight-transfer API: the worker RPCs
``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights`` and ``finish_weight_update``
drive a *weight-transfer engine* chosen by ``LLM(weight_transfer_config={"backend": ...})``, and the engine
receives checkpoint-format tensors and loads them with vLLM's layerwise reload (``initialize_layerwise_reload``,
``model.load_weights``, ``finalize_layerwise_reload``), the same lifecycle as vLLM's own NCCL engine. vLLM's
built-in wires (NCCL, CUDA IPC) exist only on GPUs; this module registers a wire of satrl's under the name
:data:`BACKEND` in vLLM's engine registry, so the same API runs on the CPU build too:

- ``init_transfer_engine`` joins the trainer's two-process gloo group (:class:`satrl.weights.link.Link`,
  exactly as the ``dist`` transport's engine process does) and receives every version the trainer broadcasts
  on a thread of its own (:class:`~satrl.weights.link.Inbox`): the trainer's push never waits for a
  generation, and nothing is pickled (:mod:`satrl.weights.link`: raw bytes, JSON headers);
- ``receive_weights`` takes the version named by the update info (waiting for its broadcast if needed) and
  loads it into the model in the model's device.

vLLM imports this module by its path when a worker builds the engine (:func:`register` records the path);
it is never imported in the trainer's process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from satrl.weights.link import Inbox, Link

BACKEND = "satrl_gloo"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Where the trainer's group is (:class:`~satrl.weights.link.Link`'s fields)."""

    port: int
    prefix: str
    host: str = "127.0.0.1"


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """The version to load: the trainer broadcasts it once; its buckets name every tensor."""

    version: int


class SatrlGlooEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM's worker side of ``weights.transport=vllm`` on satrl's gloo bucket wire (one engine per worker)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.inbox = Inbox(Link(init_info.port, init_info.prefix, init_info.host))

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        # the base class ends with torch.accelerator.synchronize(), which has no accelerator to wait for on CPU
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        state = self.inbox.take(update_info.version)
        self.model.load_weights((name, t.to(self.device)) for name, t in state.items())

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.inbox = None  # its thread is a daemon, blocked in a receive until the trainer closes the group


def register() -> None:
    """Record this engine in vLLM's registry (by module path: vLLM imports it in the worker that builds it)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "SatrlGlooEngine")
    except ValueError:  # "already registered": this process imported the extension before
        pass
