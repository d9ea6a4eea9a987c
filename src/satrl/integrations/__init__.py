"""satrl.integrations: SAT inside other RL frameworks, as plug-ins that reuse ``satrl.objectives``.

- ``satrl.integrations.verl`` (extra ``verl``): registers ``sat``, ``sat_gspo`` and their
  ``_invert``/``_prob_diff`` variants as verl policy losses, loaded by verl through the ``verl.plugins``
  entry point; select one with ``actor_rollout_ref.actor.policy_loss.loss_mode=sat``. SAT's mu is verl's
  ``old_log_probs``: the rollout engine's log-probs in bypass mode; the driver declares which through the
  ``${satrl_mu:}`` resolver (``_verl_mu``), and trainers that rewrite ``loss_mode`` are refused.
- ``satrl.integrations.trl`` (extra ``trl``): ``SATGRPOTrainer`` / ``SATGRPOConfig``, TRL's
  ``GRPOTrainer`` with SAT's clip interval (token level, or sequence level for GSPO); mu is vLLM's (or a
  ``rollout_func``'s) sampling log-probs when TRL has them (``mu_source``), and TRL's ratio is then pi / mu, as
  in verl's bypass mode.
- ``satrl.integrations.trl_vcpo`` (extra ``trl``): ``VCPOGRPOTrainer`` / ``VCPOGRPOConfig``, TRL's ``GRPOTrainer``
  with VCPO's two controls: the ESS step size on the optimizer's lr and the OPOB baseline inside TRL's own
  advantage centring and scaling (``satrl.objectives.vcpo``; mu by ``mu_source`` as for SAT).

Plug-ins are imported only on demand (each needs its framework installed). See docs/integrations.md.
"""
