"""A rollout batch's advantages: the chosen baseline (``train.advantage``, :mod:`satrl.training.baselines`, or the
objective's own, VCPO's OPOB) and the passes over the policy that measure what it needs, at the batch's first
weights: the sequences' weights and score norms (:func:`satrl.training.score_norms.score_norms`), or the tokens'
probabilities (:func:`satrl.training.logprobs.response_probs`).

The baselines themselves are pure functions of tensors (:mod:`satrl.training.advantages`); this module only feeds
them. The :class:`~satrl.training.trainer.Trainer` holds one :class:`Advantages` as ``trainer.advantages``.
"""

from __future__ import annotations

import torch

from satrl.objectives import ObjectiveSpec
from satrl.objectives.step_size import advantage_rule
from satrl.training.advantages import AdvantageInputs
from satrl.training.baselines import ADVANTAGES, DEFAULT_ADVANTAGE, resolve_advantage
from satrl.training.logprobs import response_probs
from satrl.training.microbatches import plan_microbatches, row_slice, to_device
from satrl.training.score_norms import ChunkedHead, score_norms
from satrl.training.scorer import Scorer
from satrl.types import Batch

__all__ = ["Advantages"]


class Advantages:
    """``advantages(batch)``: advantages [B] (or [B, T], a per-token baseline) with their metrics.

    ``baseline`` is the objective's own rule (None: ``advantage``, ``train.advantage``'s, GRPO's group mean by
    default); the two are exclusive."""

    def __init__(self, scorer: Scorer, objective: ObjectiveSpec, advantage: object, std_norm: bool) -> None:
        self.scorer, self.std_norm = scorer, std_norm
        self.baseline = advantage_rule(objective)  # None: train.advantage's (GRPO's group mean by default)
        self.advantage = resolve_advantage(advantage)
        if self.baseline is not None and self.advantage != DEFAULT_ADVANTAGE:
            raise ValueError(f"train.advantage={self.advantage.name}: the objective brings its own baseline (vcpo's "
                             "baseline); choose one (objective.correction.baseline=group_mean, or train.advantage="
                             "group_mean)")  # fmt: skip

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Each baseline from what it needs: the sequences' weights and score norms, or the tokens' probabilities."""
        if self.baseline is not None:
            log_w, score_sq = self.sequence_scores(batch)
            adv, stats = self.baseline(batch.rewards, batch.group_index, log_w, score_sq, self.std_norm)
        else:
            chosen = ADVANTAGES.get(self.advantage.name)
            log_w, score_sq = self.sequence_scores(batch) if "score_norms" in chosen.needs else (None, None)
            old_logp, sum_pi_sq = self.token_probs(batch) if "token_probs" in chosen.needs else (None, None)
            inp = AdvantageInputs(batch.rewards, batch.group_index, batch.mask, batch.behavior_logp, log_w, score_sq,
                                  old_logp, sum_pi_sq)  # fmt: skip
            adv, stats = chosen.fn(inp, std_norm=self.std_norm, **self.advantage.kwargs())
        return adv, {f"obj/{k}": float(v) for k, v in stats.items()}

    @torch.no_grad()
    def token_probs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:  # [B, T], [B, T] float32, CPU
        """Per token, at the current weights: log pi(y_t) and sum_v pi(v)^2, the optimal token baseline's inputs
        (:func:`~satrl.training.logprobs.response_probs`: one forward per microbatch of the step's plan, no
        backward); rows summed across data-parallel ranks as in :meth:`sequence_scores`."""
        s = self.scorer
        logp, sq = torch.zeros(batch.mask.shape), torch.zeros(batch.mask.shape)
        for p, real in s.placement.assigned(plan_microbatches(batch, s.microbatch_tokens)):
            m = to_device(row_slice(batch, p.start, p.end), s.device)
            with s.autocast():
                got = response_probs(s.model, m, s.settings.temperature, s.routing(m), length=p.longest,
                                     padded=p.padded, chunk_tokens=s.chunk_tokens, width=p.width)  # fmt: skip
            if real:  # else a zero-weight copy that lines up the ranks' collectives (data parallel)
                logp[p.start : p.end], sq[p.start : p.end] = got[0].cpu(), got[1].cpu()
        return s.placement.summed(logp), s.placement.summed(sq)

    def sequence_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:  # [B], [B] float64, CPU
        """Per row i, at the current weights: log w_i = sum_t (log pi - log mu) and ||grad_theta sum_t log pi||^2,
        the inputs of an objective's advantage rule (VCPO's OPOB). One forward and one backward per microbatch
        of the step's plan (:func:`satrl.training.score_norms.score_norms`); the backward stops at the layers'
        outputs, so the parameters' ``.grad`` are not touched. Under data parallel each rank takes the microbatches
        the placement assigns it (as a step does) and the rows' values are summed across ranks (each row is nonzero
        on one rank only: the sum is exact). With chunked log-probs (``logprob_chunk_tokens``
        > 0) the LM head's share is rebuilt row by row (:class:`~satrl.training.score_norms.ChunkedHead`), so the
        pass holds no more vocabulary-sized tensors than the step does."""
        s = self.scorer
        rows = batch.mask.shape[0]
        log_w, score_sq = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dtype=torch.float64)
        for p, real in s.placement.assigned(plan_microbatches(batch, s.microbatch_tokens)):
            m = to_device(row_slice(batch, p.start, p.end), s.device)
            head = None
            if s.chunk_tokens > 0:
                head = ChunkedHead(s.model.get_output_embeddings(), m.response_ids, s.settings.temperature)
            logp, sq = score_norms(s.model, lambda m=m, p=p: s.logp(s.model, m, p)[0], m.mask, head)
            if real:  # else a zero-weight copy that lines up the ranks' collectives (data parallel)
                w = torch.where(m.mask, logp.to(torch.float64) - m.behavior_logp.to(torch.float64), 0.0).sum(1)
                log_w[p.start : p.end], score_sq[p.start : p.end] = w.cpu(), sq.cpu()
        return s.placement.summed(log_w), s.placement.summed(score_sq)
