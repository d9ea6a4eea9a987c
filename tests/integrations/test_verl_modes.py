"""SAT's mu in each verl trainer: verl's own code from the batch a trainer builds to the actor's ``ppo_loss``.

Every test gives the rollout log-probs (the engine's, mu) a deliberate gap from the recomputed ones (pi_old)
and checks which of the two SAT's q and gate follow:

- v1 trainer (``trainer.use_v1=true``; sync, colocate_async, separate_async), bypass mode: verl's
  ``_compute_old_log_prob`` puts ``rollout_log_probs`` in ``old_log_probs``; SAT follows mu.
- v1 decoupled (verl's default): ``old_log_probs`` is pi_old and ``rollout_log_probs`` never reach a loss;
  SAT gates on pi_old, verl's rollout IS weights carry the pi_old/mu gap, and the flag says so (0).
- legacy trainer and the fully_async / one_step_off recipes in bypass mode: verl's ``apply_bypass_mode``
  rewrites ``loss_mode``; resolving their config with ``loss_mode=sat`` fails with one line.

The config is verl's own YAML composed by hydra (from any working directory: the one-step-off recipe gets
``hydra.searchpath=[pkg://verl.trainer.config]``, as docs/integrations.md prints it) and resolved as verl's
entry points resolve it. verl's v1 trainer module imports TransferQueue, cachetools, fastapi and uvicorn,
which the ``verl`` extra installs; the v1 tests import it in a subprocess with TransferQueue's store
replaced by an in-memory dict (outside ``make test-verl``, a missing one of those four is stubbed: none is
on the bypass path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from run_helpers import Extra

with Extra("verl") as verl_extra:
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from test_verl_actor import B, actor_step, rollout
    from verl.protocol import DataProto
    from verl.trainer.ppo import rollout_corr_helper as rch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.metric import AggregationType, Metric, reduce_metrics

    import satrl.integrations.verl as sv
    from satrl.integrations import _gate, _verl_mu
    VERL_ROOT = Path(verl.__file__).parent
VERL_MISSING = verl_extra.missing

pytestmark = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))

SAT = ["actor_rollout_ref.actor.policy_loss.loss_mode=sat",
       "actor_rollout_ref.actor.policy_loss._target_=satrl.integrations.verl.SatPolicyLossConfig",
       "+actor_rollout_ref.actor.policy_loss.sat_alpha=0.8",
       "+actor_rollout_ref.actor.policy_loss.sat_mu=${satrl_mu:}",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]  # verl's ActorConfig needs one
RECIPES = {"fully_async": ("experimental/fully_async_policy/config", "fully_async_ppo_trainer"),
           "one_step_off": ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer")}
# verl's one_step_off YAML looks for ppo_trainer under file://verl/trainer/config, relative to the working
# directory; this override (docs/integrations.md) finds it in the installed verl from anywhere.
SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"


@pytest.fixture(autouse=True)
def _fresh_warnings():
    torch.set_num_threads(1)
    _gate._warned_gate.clear()
    _verl_mu._warned_mu.clear()
    yield
    _verl_mu._warned_mu.clear()
    _verl_mu._refusals.clear()  # refusals tested here are not reprinted when pytest exits


def verl_config(trainer: str, overrides: list[str]):
    """verl's YAML for ``trainer`` composed by hydra, then resolved as verl's entry points do."""
    sub, name = RECIPES.get(trainer, ("trainer/config", "ppo_trainer"))
    extra = {"legacy": ["trainer.use_v1=false"], "one_step_off": [SEARCHPATH]}.get(trainer, [])
    with initialize_config_dir(config_dir=str(VERL_ROOT / sub), version_base=None):
        cfg = compose(config_name=name, overrides=overrides + extra)
    OmegaConf.resolve(cfg)  # verl's TaskRunner.run / the recipes' main do this on the driver
    return cfg


def actor_config(cfg):
    """The actor config a worker builds from the driver's ``actor_rollout_ref.actor``."""
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def engine_gap(seed: int):
    """A mini-batch whose rollout log-probs (mu) differ from the recomputed pi_old by a large token noise,
    while pi_theta is close to pi_old: SAT's q is then very different on the two sides."""
    data, logp = rollout(seed)
    g = torch.Generator().manual_seed(seed + 100)
    mask = data["response_mask"]
    mu = (data["old_log_probs"] + torch.randn(data["old_log_probs"].shape, generator=g) * 0.5) * mask
    return data, logp, mu


def expected(config, data, logp, behavior, rows):
    """satrl's objective on each of verl's micro-batches with ``behavior`` as mu: [(q, gate_rate)]."""
    spec = sv.objective_from_config("sat", config)
    out = []
    for r in rows:
        idx = torch.tensor(r)
        m = spec(logp=logp.detach()[idx], behavior_logp=behavior[idx], adv=data["advantages"][idx],
                 mask=data["response_mask"][idx].bool()).metrics
        out.append((float(m["q"]), float(m["gate_rate"])))
    return out


def assert_follows(metrics, config, data, logp, rows, side, other):
    """SAT's logged q and gate rate equal satrl's with mu = ``side`` on every micro-batch, not ``other``'s."""
    for m, (q, rate), (q_other, _) in zip(metrics, expected(config, data, logp, side, rows),
                                          expected(config, data, logp, other, rows)):
        assert m["actor/sat_q_microbatch_mean"] == pytest.approx(q, rel=1e-6)
        assert m["actor/sat_gate_rate_microbatch_mean"] == pytest.approx(rate) and rate > 0
        assert abs(q - q_other) > 0.1  # the two sides are far apart: the assertion can fail
        assert all(k in m for k in sv.SAT_METRICS)


V1_SCRIPT = r"""
import json, os, sys, types
from unittest import mock
for name in ("transfer_queue", "cachetools", "uvicorn", "fastapi"):  # the verl extra installs all four
    try:
        __import__(name)
    except ModuleNotFoundError:
        if os.environ.get("SATRL_REQUIRE_VERL") == "1":
            raise
        sys.modules[name] = mock.MagicMock(name=name)
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
import verl.trainer.ppo.v1.trainer_base as tb
import verl.trainer.ppo.v1  # registers sync / colocate_async / separate_async

inp = json.load(sys.stdin)
out = {}
for mode in sorted(tb.TRAINER_REGISTRY):
    store = TensorDict({k: torch.tensor(v) for k, v in inp["fields"].items()}, batch_size=[inp["B"]])
    tb.tq.kv_batch_get = lambda keys, partition_id, select_fields: store.select(*select_fields).clone()
    tb.tq.kv_batch_put = lambda keys, partition_id, fields: store.update(fields)
    cls = tb.get_trainer_cls(mode)
    trainer = cls.__new__(cls)  # no workers, no Ray: only the method under test runs
    trainer.config = OmegaConf.create(inp["config"])
    trainer._compute_old_log_prob(types.SimpleNamespace(keys=list(range(inp["B"])), partition_id="train"), {})
    out[mode] = {"class": cls.__name__, "old_log_probs": store["old_log_probs"].tolist()}
print(json.dumps(out))
"""


def test_v1_bypass_mode_sat_follows_the_rollout_log_probs():
    """v1 trainers, bypass mode: verl's _compute_old_log_prob hands the engine's log-probs to ppo_loss as
    old_log_probs; SAT's q and gate follow them and the flag is 1."""
    cfg = verl_config("v1", SAT + ["algorithm.rollout_correction.bypass_mode=true",
                                                "actor_rollout_ref.rollout.calculate_log_probs=true"])  # as documented
    assert cfg.actor_rollout_ref.actor.policy_loss.sat_mu == "rollout"
    data, logp, mu = engine_gap(7)
    inp = {"B": B, "config": {"algorithm": OmegaConf.to_container(cfg.algorithm)},
           "fields": {"old_log_probs": data["old_log_probs"].tolist(), "rollout_log_probs": mu.tolist()}}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", V1_SCRIPT], input=json.dumps(inp), capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {v["class"] for v in out.values()} == {"PPOTrainerSync", "PPOTrainerColocateAsync",
                                                  "PPOTrainerSeparateAsync"}
    config = actor_config(cfg)
    for mode, v in out.items():
        old = torch.tensor(v["old_log_probs"])
        assert torch.equal(old, mu), mode  # verl's swap, not ours
        _, rows, metrics = actor_step(config, {**data, "old_log_probs": old}, logp, micro_batch_size=8)
        assert_follows(metrics, config, data, logp, rows, side=mu, other=data["old_log_probs"])
        assert all(m[sv.MU_METRIC] == 1.0 for m in metrics)


def test_v1_decoupled_mode_sat_gates_on_pi_old_and_says_so():
    """v1 decoupled (verl's default, here with token-level rollout IS): old_log_probs is the recomputed
    pi_old, rollout_log_probs reach only verl's rollout correction, whose IS weights multiply SAT's loss.
    SAT's q and gate follow pi_old, actor/sat_mu_is_rollout is 0 and a warning names the setting."""
    cfg = verl_config("v1", SAT + ["algorithm.rollout_correction.bypass_mode=false",
                                                "algorithm.rollout_correction.rollout_is=token"])
    assert cfg.actor_rollout_ref.actor.policy_loss.sat_mu == "old_policy"
    data, logp, mu = engine_gap(8)
    batch = DataProto.from_single_dict({"old_log_probs": data["old_log_probs"], "rollout_log_probs": mu,
                                        "response_mask": data["response_mask"]})
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, cfg.algorithm.rollout_correction)
    weights = batch.batch["rollout_is_weights"]
    assert not torch.allclose(weights[data["response_mask"].bool()], torch.ones(()))
    config = actor_config(cfg)
    with pytest.warns(RuntimeWarning, match=r"mu is verl's recomputed pi_old .*bypass_mode=true"):
        grad, rows, metrics = actor_step(config, {**data, "rollout_is_weights": weights}, logp, micro_batch_size=8)
    assert_follows(metrics, config, data, logp, rows, side=data["old_log_probs"], other=mu)
    assert all(m[sv.MU_METRIC] == 0.0 for m in metrics)
    unweighted, _, _ = actor_step(config, data, logp, micro_batch_size=8)
    assert not torch.equal(grad, unweighted)  # verl's IS weights reach SAT's per-token loss


@pytest.mark.parametrize("trainer", ["legacy", "fully_async", "one_step_off"])
def test_trainers_whose_bypass_helper_rewrites_loss_mode_refuse_sat(trainer):
    """Legacy ray_trainer and the separated-trainer recipes call apply_bypass_mode, which sets
    policy_loss.loss_mode=bypass_mode: resolving their config with loss_mode=sat fails with one line."""
    bypass = [] if trainer in RECIPES else ["algorithm.rollout_correction.bypass_mode=true"]  # recipes: default
    with pytest.raises(ValueError, match=rf"loss_mode=sat cannot run in the {trainer} trainer with "
                                         r"algorithm.rollout_correction.bypass_mode=true") as info:
        verl_config(trainer, SAT + bypass)
    lines = [line for line in str(info.value).splitlines() if "satrl: loss_mode=sat" in line]
    fix = "trainer.use_v1=true" if trainer == "legacy" else "trainer.v1.trainer_mode=separate_async"
    assert len(lines) == 1 and fix in lines[0] and "bypass_mode=false" in lines[0]  # one line, cause and fix


@pytest.mark.parametrize("mode", ["sync", "separate_async"])
def test_v1_bypass_mode_without_calculate_log_probs_is_refused_at_config_time(mode):
    """verl's v1 trainer in bypass mode copies rollout_log_probs, which the engine returns only with
    actor_rollout_ref.rollout.calculate_log_probs=true: without it, the config is refused with one line naming
    the key, by the resolver (sat_mu declared) and by the entry points' check (undeclared) alike."""
    flags = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false",
             f"trainer.v1.trainer_mode={mode}"]
    match = r"satrl: algorithm.rollout_correction.bypass_mode=true needs actor_rollout_ref.rollout.calculate_log_probs=true"
    with pytest.raises(ValueError, match=match) as info:
        verl_config("v1", SAT + flags)
    assert len([line for line in str(info.value).splitlines() if "satrl: " in line]) == 1  # one line
    with initialize_config_dir(config_dir=str(VERL_ROOT / "trainer" / "config"), version_base=None):
        undeclared = compose(config_name="ppo_trainer", overrides=[a for a in SAT if "sat_mu" not in a] + flags)
    with pytest.raises(ValueError, match="^" + match) as info:
        _verl_mu.preflight(undeclared)
    assert "\n" not in str(info.value)
    cfg = verl_config("v1", SAT + flags[:1] + [flags[1].replace("false", "true")] + flags[2:])
    assert cfg.actor_rollout_ref.actor.policy_loss.sat_mu == "rollout"  # with the key: accepted, mu the engine's


@pytest.mark.parametrize("trainer", ["legacy", "fully_async", "one_step_off"])
def test_those_trainers_in_decoupled_mode_give_sat_pi_old(trainer):
    cfg = verl_config(trainer, SAT + ["algorithm.rollout_correction.bypass_mode=false"])
    assert actor_config(cfg).policy_loss.sat_mu == "old_policy"


def test_the_reason_verls_bypass_helper_rewrites_loss_mode():
    """verl's own apply_bypass_mode (legacy and separated trainers): old_log_probs := rollout_log_probs and
    the policy-loss config's loss_mode := bypass_mode, which is why those trainers refuse SAT."""
    data, _, mu = engine_gap(9)
    batch = DataProto.from_single_dict({"old_log_probs": data["old_log_probs"], "rollout_log_probs": mu})
    policy_loss = OmegaConf.create({"loss_mode": "sat"})
    verls_own = rch.apply_bypass_mode.__wrapped__  # satrl guards it (next test); this is verl's function
    verls_own(batch, OmegaConf.create({"bypass_mode": True}), policy_loss)
    assert policy_loss.loss_mode == "bypass_mode" and torch.equal(batch.batch["old_log_probs"], mu)


def test_the_guarded_bypass_helper_refuses_sat_without_a_declared_mu():
    """No sat_mu override: verl's trainer reaches apply_bypass_mode (imported at its call site, as verl does)
    and gets one line instead of a silent replacement; other loss modes pass through to verl's function."""
    data, _, mu = engine_gap(9)
    batch = DataProto.from_single_dict({"old_log_probs": data["old_log_probs"], "rollout_log_probs": mu})
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode as at_call_site

    with pytest.raises(ValueError, match=r"^satrl: loss_mode=sat_gspo cannot run where verl's apply_bypass_mode") as e:
        at_call_site(batch, OmegaConf.create({"bypass_mode": True}), OmegaConf.create({"loss_mode": "sat_gspo"}))
    assert "\n" not in str(e.value)
    # The advice is the one for the trainer that called it (verl 0.9.1's two call sites, by module).
    for caller, fix, not_fix in [("verl.trainer.ppo.ray_trainer", "set trainer.use_v1=true", "separate_async"),
                                 ("verl.experimental.separation.ray_trainer", "trainer_mode=separate_async",
                                  "set trainer.use_v1=true")]:
        call = {"__name__": caller, "helper": at_call_site, "args": (batch, OmegaConf.create({"bypass_mode": True}),
                                                                    OmegaConf.create({"loss_mode": "sat"}))}
        with pytest.raises(ValueError) as e:
            exec("helper(*args)", call)
        assert fix in str(e.value) and not_fix not in str(e.value), caller
    vanilla = OmegaConf.create({"loss_mode": "vanilla"})
    at_call_site(batch, OmegaConf.create({"bypass_mode": True}), vanilla)
    assert vanilla.loss_mode == "bypass_mode"


def test_undeclared_mu_is_logged_as_unknown_and_warned():
    cfg = verl_config("v1", SAT[:3] + SAT[4:])  # no sat_mu
    data, logp, _ = engine_gap(10)
    with pytest.warns(RuntimeWarning, match=r"satrl cannot see; declare it with \+actor_rollout_ref"):
        _, _, metrics = actor_step(actor_config(cfg), data, logp, micro_batch_size=8)
    assert all(m[sv.MU_METRIC] == -1.0 for m in metrics)
    with pytest.raises(ValueError, match="sat_mu='engine'; choose one of"):
        sv.SatPolicyLossConfig(loss_mode="sat", sat_mu="engine")


def test_sat_metrics_are_reduced_as_their_names_say():
    """verl's reduction, as its engine worker applies it: each ppo_loss metric is Metric(MEAN) over
    micro-batches (Metric.aggregate_dp), then reduce_metrics over mini-batches, by name. SAT's names say
    microbatch_mean and carry no "min"/"max", so each stage is the mean the name promises."""
    cfg = verl_config("v1", SAT + ["algorithm.rollout_correction.bypass_mode=true"])
    data, logp, mu = engine_gap(11)
    _, _, metrics = actor_step(actor_config(cfg), {**data, "old_log_probs": mu}, logp, micro_batch_size=4)
    assert len(metrics) == 4
    names = [*sv.SAT_METRICS, "actor/sat_abs_d_microbatch_mean", sv.MU_METRIC]
    per_mini_batch = {}
    for k in names:
        assert "min" not in k and "max" not in k
        rank = Metric(AggregationType.MEAN)  # one dp rank's micro-batch values, as the engine collects them
        rank.extend([m[k] for m in metrics])
        logged = Metric.aggregate_dp([rank])
        assert logged == pytest.approx(sum(m[k] for m in metrics) / len(metrics))
        per_mini_batch[k] = [logged, logged + 1.0]
    reduced = reduce_metrics({k: list(v) for k, v in per_mini_batch.items()})  # it reduces in place
    assert all(reduced[k] == pytest.approx(per_mini_batch[k][0] + 0.5) for k in names)  # a mean, not min/max
    lowest = [m["actor/sat_c_lowest_microbatch_mean"] for m in metrics]
    assert min(lowest) < max(lowest)  # micro-batch minima differ: a mean of them is no minimum


def test_resolver_is_registered_by_the_plugin():
    assert OmegaConf.has_resolver("satrl_mu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        root = OmegaConf.create({"algorithm": {"rollout_correction": {"bypass_mode": True}},
                                 "trainer": {"use_v1": True}, "x": "${satrl_mu:}"})
        assert root.x == "rollout"
