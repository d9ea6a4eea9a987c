"""Methods mixed into every vLLM worker (``worker_extension_cls``), called through ``LLM.collective_rpc``.

This is vLLM's supported seam for RL weight updates: the methods run inside the worker process that owns
the model, whichever executor vLLM chose. It loads in any process: vLLM is imported only where it is installed.
Weights travel as one safetensors byte string in the RPC's arguments: no pickle, no disk, and it survives
every hop of vLLM's RPC (its msgpack client link and its shared-memory executor queue; raw tensors do not
pass the latter). That is the ``inproc`` and ``dist`` transports' last hop. ``weights.transport=vllm`` skips it:
vLLM's own weight-transfer API loads each version, over the wire :mod:`satrl.engines.vllm_transfer` registers
when vLLM imports this module in its workers.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import load_file

from satrl.dtypes import named_dtype


def _register_transfer_engine() -> None:
    try:
        from satrl.engines.vllm_transfer import register
    except ImportError:  # no vLLM in this process: nothing can build the engine here
        return
    register()


_register_transfer_engine()


class SatrlWorkerExtension:
    """Weight sync for :class:`satrl.engines.vllm_engine.VLLMEngine`. ``self`` is the vLLM worker."""

    def _satrl_model(self) -> torch.nn.Module:
        return self.model_runner.model  # type: ignore[attr-defined]

    def satrl_load_weights(self, payload: bytes, round_to: str | None = None) -> int:
        """Load Hugging Face-named tensors (``payload``: ``safetensors.torch.save(state_dict)``) into the running
        model (vLLM's own ``load_weights`` maps HF names onto its fused layers). ``round_to="bfloat16"`` rounds
        floating tensors through bf16 first (``numerics=bf16-weights``). Returns the number of tensors received."""
        return self._satrl_reload(load_safetensors(payload), round_to)

    def satrl_round_weights(self, round_to: str) -> int:
        """Reload the checkpoint the engine started from, rounded through ``round_to`` (used once at start-up
        for ``numerics=bf16-weights``), through the same reload path as every later version. Rounding the
        running parameters in place would miss the layers a platform repacks after loading (vLLM's CPU linear
        layers keep a packed copy), and the first batches would run on other weights than later ones.
        Returns the number of tensors reloaded."""
        path = Path(self.vllm_config.model_config.model)  # type: ignore[attr-defined]
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}: cannot reload the weights rounded")
        state = {k: v for f in files for k, v in load_file(f).items()}
        hf = self.vllm_config.model_config.hf_config  # type: ignore[attr-defined]
        if getattr(hf, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
            # a tied checkpoint stores the head once; without its name, the reload restores the head's old
            # (unrounded) tensor, as the trainer's state dict (which names both) never does
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        return self._satrl_reload(state, round_to)

    def _satrl_reload(self, state: dict[str, torch.Tensor], round_to: str | None) -> int:
        dtype = named_dtype(round_to) if round_to else None
        device = next(self._satrl_model().parameters()).device

        def cast(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device)

        weights = [(name, cast(t)) for name, t in state.items()]
        # vLLM's in-place reload: after start-up some platforms repack layers (CPU linear layers lose their
        # weight_loader), and reload_weights restores the loading path before calling model.load_weights
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(weights)
