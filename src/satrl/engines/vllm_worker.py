"""Methods mixed into every vLLM worker (``worker_extension_cls``), called through ``LLM.collective_rpc``.

This is vLLM's supported seam for RL weight updates: the methods run inside the worker process that owns
the model, whichever executor vLLM chose. The module imports nothing from vLLM, so it loads in any process.
Weights travel as one safetensors byte string in the RPC's arguments: no pickle, no disk, and it survives
every hop of vLLM's RPC (its msgpack client link and its shared-memory executor queue; raw tensors do not
pass the latter). For tiny models that is a few MB. For large models on GPUs this method is the place to
receive an NCCL broadcast instead.
"""

from __future__ import annotations

import torch
from safetensors.torch import load as load_safetensors


class SatrlWorkerExtension:
    """Weight sync for :class:`satrl.engines.vllm_engine.VLLMEngine`. ``self`` is the vLLM worker."""

    def _satrl_model(self) -> torch.nn.Module:
        return self.model_runner.model  # type: ignore[attr-defined]

    def satrl_load_weights(self, payload: bytes, round_to: str | None = None) -> int:
        """Load Hugging Face-named tensors (``payload``: ``safetensors.torch.save(state_dict)``) into the running model (vLLM's own ``load_weights`` maps HF names
        onto its fused layers). ``round_to="bfloat16"`` rounds floating tensors through bf16 first
        (``numerics=bf16-weights``). Returns the number of tensors received."""
        dtype = getattr(torch, round_to) if round_to else None
        device = next(self._satrl_model().parameters()).device

        def cast(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device)

        weights = [(name, cast(t)) for name, t in load_safetensors(payload).items()]
        # vLLM's in-place reload: after start-up some platforms repack layers (CPU linear layers lose their
        # weight_loader), and reload_weights restores the loading path before calling model.load_weights
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(weights)

    def satrl_round_weights(self, round_to: str) -> int:
        """Round every floating parameter of the running model through ``round_to`` in place (used once at
        start-up for ``numerics=bf16-weights``, when the engine loaded its first weights from disk)."""
        dtype = getattr(torch, round_to)
        n = 0
        with torch.no_grad():
            for p in self._satrl_model().parameters():
                if p.is_floating_point():
                    p.copy_(p.to(dtype).to(p.dtype))
                    n += 1
        return n
