"""One call for the trainer: every per-step diagnostic under its ``metrics.jsonl`` key.

The key names live here (and in docs/metrics.md) so the trainer does not spell them out. Inputs that are
None switch their group off: no ``lag`` -> no ``lag/*``/``bylag/*``; no ``logp_at_version`` -> no
``mismatch/d_policy``/``d_impl``; no routings -> no ``moe/*``; no ``tok/gate`` -> no ``gate/*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from satrl.diagnostics.lag import by_lag, lag_stats
from satrl.diagnostics.mismatch import decompose_mismatch, gate_tv_share, mismatch_stats
from satrl.diagnostics.routing import routing_disagreement
from satrl.diagnostics.update import update_stats
from satrl.tensors import scoring_positions
from satrl.types import Batch

__all__ = ["StepTokens", "step_diagnostics", "trainer_step_diagnostics"]


class StepTokens(Protocol):
    """A step's per-token outputs, gathered over its microbatches (all [B, T] but ``routing``)."""

    logp: torch.Tensor
    gate: torch.Tensor
    clipped: torch.Tensor
    d: torch.Tensor
    routing: torch.Tensor | None  # the experts the trainer's forward used, or None (dense, or not captured)


def step_diagnostics(
    *,
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    lag: torch.Tensor | None = None,
    tok: Mapping[str, torch.Tensor] | None = None,
    logp_at_version: torch.Tensor | None = None,
    engine_routing: torch.Tensor | None = None,
    trainer_routing: torch.Tensor | None = None,
    adv: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """All diagnostics of one batch, as ``{metrics.jsonl key: 0-dim detached tensor}``.

    Call it once per optimizer step on all of the step's tokens (microbatches concatenated along B after
    padding to one T): averaging per-microbatch results would weight the ``bylag/*`` buckets and the
    percentiles wrongly.

    Args:
        logp, behavior_logp, mask: [B, T] as in :func:`mismatch_stats`.
        lag: [B, T] or [B] int, trainer version − sample version.
        tok: the objective's per-token tensors (``tok/gate``, ``tok/clipped``, ``tok/d``; any may be absent).
        logp_at_version: [B, T] trainer log-probs under the sample's weight version (snapshot ring).
        engine_routing, trainer_routing: [B, T, layers, top_k] expert indices (MoE only).
        adv: [B] (or [B, T]) the step's advantages, for ``update/*`` (:mod:`satrl.diagnostics.update`).

    Keys: ``mismatch/{d_pi,d_mean,d_p90_abs,d_max_abs,logratio_var}``, ``lag/{mean,min,max}``,
    ``bylag/<k>/{frac_tokens,abs_d,clipfrac,gate_rate}``, ``gate/{tv_share,tv_lift,tv_mass_mean}``,
    ``mismatch/{d_policy,d_impl,frac_policy,frac_impl}``, ``moe/route_disagree``,
    ``moe/route_disagree/layer<i>``, ``moe/expert_diff``, ``update/{ess_ratio,adv_pos_share}``.
    """
    tok = dict(tok or {})
    out: dict[str, torch.Tensor] = {}
    for k, v in mismatch_stats(logp, behavior_logp, mask).items():
        out[f"mismatch/{k}"] = v
    if lag is not None:
        for k, v in lag_stats(lag, mask).items():
            out[f"lag/{k}"] = v
        d = tok.get("tok/d", logp.detach() - behavior_logp.detach())
        per_token = {"abs_d": d.abs()}
        if "tok/clipped" in tok:
            per_token["clipfrac"] = tok["tok/clipped"]
        if "tok/gate" in tok:
            per_token["gate_rate"] = tok["tok/gate"]
        for k, v in by_lag(lag, mask, **per_token).items():
            out[f"bylag/{k}"] = v
    if "tok/gate" in tok:
        g = gate_tv_share(logp, behavior_logp, tok["tok/gate"], mask)
        for k in ("tv_share", "tv_lift", "tv_mass_mean"):
            out[f"gate/{k}"] = g[k]
    if logp_at_version is not None:
        dec = decompose_mismatch(logp, logp_at_version, behavior_logp, mask)
        for k in ("d_policy", "d_impl", "frac_policy", "frac_impl"):
            out[f"mismatch/{k}"] = dec[k]
    if adv is not None:
        d = tok.get("tok/d", logp.detach() - behavior_logp.detach())
        for k, v in update_stats(d, mask, adv).items():
            out[f"update/{k}"] = v
    if engine_routing is not None and trainer_routing is not None:
        for k, v in routing_disagreement(engine_routing, trainer_routing, mask).items():
            out[f"moe/{k}"] = v
    return out


def trainer_step_diagnostics(mb: Batch, lag: torch.Tensor, adv: torch.Tensor, logp_at_version: torch.Tensor | None,
                             got: StepTokens) -> dict[str, float]:  # fmt: skip
    """:func:`step_diagnostics` of one optimizer step of the trainer, as floats: minibatch ``mb`` (on the device),
    its tokens' realized ``lag`` [B, T], advantages ``adv`` [B], log pi^(l) at each token's version (or None) and
    the step's gathered per-token outputs ``got`` (:class:`satrl.training.placement.StepOutputs`)."""
    engine_routing = None
    if got.routing is not None:  # the engine's experts at the scoring positions, vs the ones this forward used
        pos = scoring_positions(mb.prompt_len, mb.mask.shape[1], mb.routing.shape[1])  # [B, T]
        engine_routing = mb.routing.gather(1, pos[:, :, None, None].expand(-1, -1, *mb.routing.shape[2:]))
    out = step_diagnostics(
        logp=got.logp,
        behavior_logp=mb.behavior_logp,
        mask=mb.mask,
        lag=lag,
        tok={"tok/gate": got.gate, "tok/clipped": got.clipped, "tok/d": got.d},
        logp_at_version=logp_at_version,
        engine_routing=engine_routing,
        trainer_routing=got.routing,
        adv=adv,
    )
    return {k: float(v) for k, v in out.items()}
