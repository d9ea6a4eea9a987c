"""What shapes one optimizer step's update, for every objective (no extra pass: from the step's own tensors).

The repair trial found VCPO repairs without knowing how; these say what an objective changes in the update:

- ``update/ess_ratio``: ESS / B of the sequence weights w_i = prod_t pi / mu over the step's B responses with an
  active token (the quantity VCPO's step size reads; :func:`satrl.objectives.vcpo.effective_sample_size`).
  1 = every response weighs alike; 1/B = one response carries the step.
- ``update/adv_pos_share``: the share of the step's advantage mass on responses with A_i > 0, the mass being
  sum_i |A_i| n_i (n_i its active tokens, the weight token-mean aggregation gives it). 0.5 = balanced; GRPO's
  group-centred advantages sit near 0.5, a baseline moved up pushes mass to the negative side.
"""

from __future__ import annotations

import torch

from satrl.objectives.vcpo import effective_sample_size, sequence_log_weights

__all__ = ["update_stats"]


@torch.no_grad()
def update_stats(d: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> dict[str, torch.Tensor]:
    """``d`` [B, T] log pi - log mu, ``mask`` [B, T] bool, ``adv`` [B] (or [B, T]: its mean over active tokens
    is the row's). Returns 0-dim float64 tensors (module docstring); NaN where no row is active."""
    mask = mask.bool()
    valid = mask.any(1)
    n = valid.sum().to(torch.float64)
    ess = effective_sample_size(sequence_log_weights(d, mask), valid)
    tokens = mask.sum(1).to(torch.float64)
    a = adv.to(torch.float64)
    if a.dim() == 2:
        a = torch.where(mask, a, 0.0).sum(1) / tokens.clamp(min=1.0)
    mass = a.abs() * tokens
    pos = torch.where(a > 0, mass, 0.0).sum() / mass.sum()
    return {"ess_ratio": ess / n, "adv_pos_share": pos}
