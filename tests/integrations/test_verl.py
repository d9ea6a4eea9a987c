"""The verl plug-in against the real ``verl`` package (extra ``verl``).

Without verl these tests skip with the reason printed (``-ra``), except
``test_verl_is_installed_when_required``, which fails when ``SATRL_REQUIRE_VERL=1``: ``make test-verl``
sets it in the environment built with ``pip install '.[verl]'``, so the plug-in tests cannot silently not
run there. The main environment has no verl; there they skip.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from run_helpers import Extra
from satrl.objectives import aggregate, policy_loss

with Extra("verl") as verl_extra:
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig

    import satrl.integrations.verl as sv
VERL_MISSING = verl_extra.missing


needs_verl = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))
REQUIRED = os.environ.get("SATRL_REQUIRE_VERL") == "1"
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SATRL_AGG_MODES = [m for m in AGG_MODES if m != "token-sum"]  # satrl's aggregate has no token-sum
VERL_METRIC_KEYS = {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_verl_is_installed_when_required():
    if REQUIRED:
        assert VERL_MISSING is None, f"SATRL_REQUIRE_VERL=1 but {VERL_MISSING}"
    else:  # the check itself must still hold: the plug-in imports exactly when verl does
        assert (VERL_MISSING is None) == ("satrl.integrations.verl" in sys.modules)


def actor_config(**policy_loss) -> ActorConfig:
    """verl's actor config as its trainer builds it, radii 0.2 / 0.28, dual clip 3."""
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=0.2, clip_ratio_high=0.28,
        policy_loss=sv.SatPolicyLossConfig(**policy_loss),
    )


def batch(seed: int, b: int = 8, t: int = 16, pad: float = 50.0, drift: float = 0.3, noise: float = 0.5):
    """Stale-looking microbatch: per-sequence drift (clips GSPO) + token noise (clips and dual-clips GRPO).

    With small ``drift``/``noise`` SAT's gated tokens lie inside PPO's interval, where SAT differs from PPO.
    Masked positions of ``old`` hold ``pad``: finite garbage by default (verl's own losses turn NaN padding
    into a NaN loss in the seq-mean modes), NaN where only the plug-in is run.
    """
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.2
    mask[3] = False  # an empty response
    mask[0, 0] = True
    old = torch.randn(b, t, generator=g) * 0.5 - 1.5
    logp = old + torch.randn(b, 1, generator=g) * drift + torch.randn(b, t, generator=g) * noise
    logp[0, 0] = old[0, 0] + 1.5  # r = e^1.5 > clip_ratio_c = 3
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    adv[0] = -1.0
    old = torch.where(mask, old, pad)  # masked garbage must not leak into loss or gradient
    weights = torch.rand(b, t, generator=g) + 0.5
    return {"old": old, "logp": logp, "adv": adv, "mask": mask, "weights": weights}


def run(fn, x, mode, config, weights=None):
    """(loss, d loss / d logp, metrics) of a verl-signature policy loss."""
    logp = x["logp"].clone().requires_grad_()
    loss, metrics = fn(x["old"], logp, x["adv"], x["mask"], loss_agg_mode=mode, config=config,
                       rollout_is_weights=weights)
    loss.backward()
    return loss.detach(), logp.grad, metrics


@needs_verl
def test_plugin_is_loaded_by_a_fresh_import_verl():
    """A fresh ``import verl`` (nothing else) imports the plug-in and registers its losses through verl's other
    hook, VERL_USE_EXTERNAL_MODULES, with entry points switched off. (verl's entry-point discovery, a
    ``verl.plugins`` entry point admitted by name through VERL_USE_EXTERNAL_PLUGINS: the fresh ``import verl``
    of test_verl_import_cost.py::test_import_verl_loads_only_the_plugins_hook_and_registers_on_first_use.)
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VERL_USE_EXTERNAL_PLUGINS": "none",
           "VERL_USE_EXTERNAL_MODULES": "satrl.integrations.verl"}
    code = textwrap.dedent("""
        import sys
        import verl
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R
        print("loaded" if "satrl.integrations.verl" in sys.modules else "not-loaded")
        print(",".join(sorted(k for k in R if k.startswith("sat"))) or "-")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, names = out.stdout.split()
    assert loaded == "loaded"
    assert names.split(",") == sorted(sv.VARIANTS)


@needs_verl
def test_installed_satrl_declares_the_verl_entry_point():
    """satrl's own metadata (pyproject) points verl at the plug-in; required in CI's extras step."""
    eps = importlib.metadata.entry_points(group="verl.plugins")
    ours = [ep for ep in eps if ep.value == "satrl.integrations.verl"]
    if not ours and not REQUIRED:
        pytest.skip("the installed satrl has no verl.plugins entry point yet (pip install -e . after pyproject)")
    assert ours, f"no verl.plugins entry point for satrl.integrations.verl; found {[ep.value for ep in eps]}"
    assert ours[0].dist is not None and ours[0].dist.name == "satrl-async"


@needs_verl
def test_registered_losses_are_verls_registry_entries():
    assert sv.register() == list(sv.VARIANTS)  # idempotent
    for name in sv.VARIANTS:
        assert core_algos.get_policy_loss_fn(name) is sv.LOSS_FNS[name]
    assert {"vanilla", "gspo"} <= set(core_algos.POLICY_LOSS_REGISTRY)  # verl's own are untouched


@needs_verl
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("ours,theirs", [("sat", "vanilla"), ("sat_gspo", "gspo")])
@pytest.mark.parametrize("extras", ["plain", "is_weights+dp"])
def test_gate_off_equals_verls_own_loss(ours, theirs, mode, extras):
    """alpha = 1: no token is gated, so SAT is verl's PPO clip (dual clip for sat) bit for bit."""
    x = batch(0)
    weights = x["weights"] if extras != "plain" else None
    results = []
    for name in (ours, theirs):
        config = actor_config(sat_alpha=1.0)
        if extras != "plain":  # what verl's actor sets for dp > 1 (workers/utils/losses.py)
            config.global_batch_info.update(dp_size=2, batch_num_tokens=int(x["mask"].sum()) * 2,
                                            global_batch_size=16, loss_scale_factor=None)
        results.append(run(core_algos.get_policy_loss_fn(name), x, mode, config, weights))
    (loss, grad, metrics), (ref_loss, ref_grad, ref_metrics) = results
    assert torch.equal(loss, ref_loss)
    assert torch.equal(grad, ref_grad)
    assert grad.abs().sum() > 0
    assert VERL_METRIC_KEYS <= set(metrics) and all(isinstance(v, float) for v in metrics.values())
    assert metrics["actor/sat_gate_rate_microbatch_mean"] == 0.0
    assert ref_metrics["actor/pg_clipfrac"] > 0  # the clip is exercised, not vacuous
    if theirs == "vanilla":
        assert ref_metrics["actor/pg_clipfrac_lower"] > 0  # so is the dual clip
    for key in VERL_METRIC_KEYS:
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), key


def satrl_reference(name: str, x, alpha: float, exponent: float = 2.0):
    """The same objective straight from satrl.objectives (loss_tok, logp leaf)."""
    v = sv.VARIANTS[name]
    logp = x["logp"].clone().requires_grad_()
    loss_tok, metrics, _ = policy_loss(
        v.preset, logp=logp, behavior_logp=x["old"], adv=x["adv"], mask=x["mask"], eps_low=0.2, eps_high=0.28,
        dual_clip=None if v.per_sequence else 3.0, alpha=alpha, exponent=exponent, proxy=v.proxy,
        invert=v.invert,
    )
    return loss_tok, logp, metrics


@needs_verl
@pytest.mark.parametrize("mode", SATRL_AGG_MODES)
@pytest.mark.parametrize("name", ["sat", "sat_invert", "sat_prob_diff", "sat_gspo", "sat_gspo_invert",
                                  "sat_gspo_prob_diff"])
def test_gate_on_matches_satrl_objectives(name, mode):
    """alpha = 0.8: the plug-in's loss is satrl's per-token loss under verl's agg_loss, bit for bit, and
    its gradient is bit for bit that of satrl's ``aggregate``; the value equals satrl's ``aggregate`` up to
    the reduction order (verl sums per sequence first in the seq-mean-token-sum modes)."""
    x = batch(1, pad=float("nan"), drift=0.05, noise=0.15)
    loss, grad, metrics = run(sv.LOSS_FNS[name], x, mode, actor_config(sat_alpha=0.8, sat_exponent=3.0))
    loss_tok, logp, ref = satrl_reference(name, x, alpha=0.8, exponent=3.0)
    ref_loss = aggregate(loss_tok, x["mask"], mode)
    ref_loss.backward()
    assert torch.equal(loss, core_algos.agg_loss(loss_tok.detach(), x["mask"], mode))
    assert torch.equal(grad, logp.grad)
    ulp = torch.finfo(torch.float32).eps * ref_loss.abs()
    assert (loss - ref_loss).abs() <= (0 if mode in ("token-mean", "seq-mean-token-mean") else 2 * ulp)
    assert metrics["actor/sat_gate_rate_microbatch_mean"] == pytest.approx(float(ref["gate_rate"])) and metrics[
        "actor/sat_gate_rate_microbatch_mean"] > 0
    assert metrics["actor/sat_q_microbatch_mean"] == float(ref["q"])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(ref["clipfrac_high"] + ref["clipfrac_low"]))


@needs_verl
def test_gate_on_changes_the_loss_and_contracts_the_radii():
    """SAT (alpha = 0.8) is not vanilla on this stale batch: gated tokens lose gradient, radii shrink."""
    x = batch(2, drift=0.05, noise=0.15)
    loss, grad, m = run(sv.LOSS_FNS["sat"], x, "token-mean", actor_config(sat_alpha=0.8))
    ref_loss, ref_grad, _ = run(core_algos.get_policy_loss_fn("vanilla"), x, "token-mean", actor_config())
    assert not torch.equal(grad, ref_grad)
    assert (grad == 0).sum() > (ref_grad == 0).sum()  # contracted bounds clip more tokens
    assert m["actor/sat_eps_high_microbatch_mean"] < 0.28 and m["actor/sat_eps_low_microbatch_mean"] < 0.2
    assert 0 < m["actor/sat_c_lowest_microbatch_mean"] < 0.5  # psi(u; q) < 1/2 on gated tokens (u > q)


@needs_verl
def test_rollout_is_weights_multiply_the_per_token_loss():
    x = batch(3)
    cfg = actor_config(sat_alpha=0.8)
    loss, _, _ = run(sv.LOSS_FNS["sat"], x, "token-sum", cfg, x["weights"])
    loss_tok, _, _ = satrl_reference("sat", x, alpha=0.8)
    expected = torch.where(x["mask"], loss_tok.detach() * x["weights"], 0.0).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@needs_verl
def test_config_follows_verls_radii_and_satrl_keys():
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio=0.3,
                      clip_ratio_low=None, clip_ratio_high=0.4, clip_ratio_c=5.0)
    spec = sv.objective_from_config("sat", cfg)  # plain PolicyLossConfig: satrl defaults
    expected = {"eps_low": 0.3, "eps_high": 0.4, "dual_clip": 5.0, "alpha": 0.9, "exponent": 2.0,
                "proxy": "log_ratio", "invert": False}
    assert {k: getattr(spec.trust_region, k) for k in expected} == expected
    assert sv.objective_from_config("sat_gspo", cfg).trust_region.dual_clip is None  # as verl's gspo
    assert sv.objective_from_config("sat_gspo_invert", cfg).trust_region.invert is True
    assert sv.objective_from_config("sat", actor_config(sat_proxy="prob_diff")).trust_region.proxy == "prob_diff"


@needs_verl
@pytest.mark.parametrize("loss_mode,keys,match", [
    ("sat", {"sat_proxy": "version_age"}, "not available in verl"),
    ("sat_invert", {"sat_invert": False}, "already sets invert=True"),
    ("sat_prob_diff", {"sat_proxy": "log_ratio"}, "already sets proxy='prob_diff'"),
    ("sat", {"sat_alpha": 1.5}, "alpha"),
    ("sat", {"sat_proxy": "entropy"}, "proxy"),
])
def test_bad_config_is_refused_with_the_valid_choices(loss_mode, keys, match):
    with pytest.raises(ValueError, match=match):
        sv.objective_from_config(loss_mode, actor_config(**keys))


@needs_verl
def test_unknown_mode_and_missing_config_are_refused():
    with pytest.raises(ValueError, match="unknown satrl loss_mode 'sat_gpso'; valid choices: .*'sat_gspo'"):
        sv.objective_from_config("sat_gpso", actor_config())
    x = batch(4)
    with pytest.raises(ValueError, match="needs verl's actor config"):
        sv.LOSS_FNS["sat"](x["old"], x["logp"], x["adv"], x["mask"])


@needs_verl
def test_hydra_style_config_reaches_the_loss():
    """The documented override path: verl builds actor.policy_loss from its ``_target_``; with ours the
    satrl keys survive, with verl's PolicyLossConfig they are rejected (why the docs set ``_target_``)."""
    def actor(target: str):
        return OmegaConf.create({
            "_target_": "verl.workers.config.ActorConfig", "strategy": "fsdp", "rollout_n": 1,
            "ppo_micro_batch_size_per_gpu": 2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3,
            "policy_loss": {"_target_": target, "loss_mode": "sat_gspo", "sat_alpha": 0.95, "sat_exponent": 4},
        })

    cfg = omega_conf_to_dataclass(actor("satrl.integrations.verl.SatPolicyLossConfig"))
    assert isinstance(cfg, ActorConfig) and isinstance(cfg.policy_loss, sv.SatPolicyLossConfig)
    fn = core_algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    assert fn is sv.LOSS_FNS["sat_gspo"]
    p = sv.objective_from_config("sat_gspo", cfg).trust_region
    assert (p.alpha, p.exponent, p.eps_low, p.eps_high) == (0.95, 4.0, 0.1, 0.3)
    with pytest.raises(Exception, match="sat_alpha"):
        omega_conf_to_dataclass(actor("verl.workers.config.PolicyLossConfig"))


@needs_verl
def test_installed_verl_is_in_the_extras_range_and_declares_the_plugin():
    """What ``pip install '.[verl]'`` gives (distribution satrl-async): a verl inside the extra's pin (the versions CI
    tests), and the installed satrl's ``verl.plugins`` entry point. (That verl's trainer entry point then imports
    and resolves ``loss_mode=sat`` to the plug-in with nothing imported by hand: the fresh ``import
    verl.trainer.main_ppo`` of test_verl_recipes.py::test_the_verl_extra_brings_what_verls_trainers_and_recipes_import.)"""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in importlib.metadata.requires("satrl-async") or []]
    pins = [r for r in reqs if r.name == "verl" and r.marker is not None and r.marker.evaluate({"extra": "verl"})]
    assert pins, f"satrl-async declares no verl extra: {reqs}"
    version = importlib.metadata.version("verl")
    assert pins[0].specifier.contains(version), f"verl {version} is outside the verl extra's {pins[0].specifier}"
    if not any(ep.value == "satrl.integrations.verl" for ep in importlib.metadata.entry_points(group="verl.plugins")):
        if REQUIRED:
            pytest.fail("the installed satrl declares no verl.plugins entry point")
        pytest.skip("the installed satrl has no verl.plugins entry point yet (pip install -e . after pyproject)")


@needs_verl
def test_verl_env_runs_on_satrl_transformers_floor():
    """satrl's transformers floor is the pin of verl's rollout-engine extras (vllm, sglang, cpu), so satrl
    installs beside them; ``make test-verl`` builds its environment on that pin, so the floor is tested."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    ours = [Requirement(r) for r in importlib.metadata.requires("satrl-async") or [] if r.startswith("transformers")]
    floors = [s.version for r in ours if r.marker is None for s in r.specifier if s.operator == ">="]
    assert len(floors) == 1, ours
    verls = [Requirement(r) for r in importlib.metadata.requires("verl") or []]
    pins = {str(s.version) for r in verls if r.name == "transformers" and r.marker is not None
            and any(r.marker.evaluate({"extra": e}) for e in ("vllm", "sglang", "cpu"))
            for s in r.specifier if s.operator == "=="}
    assert len(pins) == 1 and Version(floors[0]) <= Version(pins.pop()), (floors, pins)
    installed = Version(importlib.metadata.version("transformers"))
    assert installed >= Version(floors[0])
    if REQUIRED:  # the verl environment of `make test-verl`: exactly the floor
        assert installed.release[:len(Version(floors[0]).release)] == Version(floors[0]).release, \
            f"make test-verl runs on transformers {installed}, not satrl's floor {floors[0]}"


def test_verl_extra_pins_the_transformers_make_test_verl_tests():
    """``pip install '.[verl]'`` gets the transformers series ``make test-verl`` runs on (the Makefile's
    VERL_TRANSFORMERS), inside what verl's own metadata admits where verl is installed; the install docs say
    that ``.[verl,vllm]`` cannot be installed together and what to do instead. Reads pyproject.toml itself, so
    it holds before the environment is rebuilt."""
    import re
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    repo = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [Requirement(r) for r in extras["verl"] if Requirement(r).name == "transformers"]
    assert len(pins) == 1, extras["verl"]
    tested = Version(re.search(r"^VERL_TRANSFORMERS := (\S+)$", (repo / "Makefile").read_text(), re.M)[1])
    spec = pins[0].specifier
    assert spec.contains(tested), f"the verl extra's transformers{spec} excludes make test-verl's {tested}"
    upper = [Version(s.version) for s in spec if s.operator == "<"]
    assert upper and upper[0] <= Version(f"{tested.major}.{tested.minor + 1}"), \
        f"transformers{spec} admits minor versions make test-verl does not run ({tested})"
    try:
        verls = [Requirement(r) for r in importlib.metadata.requires("verl") or []]
    except importlib.metadata.PackageNotFoundError:
        verls = []
    for r in verls:  # verl's own transformers range, without an extra: the pin must lie inside it
        if r.name == "transformers" and r.marker is None:
            assert r.specifier.contains(tested), (r, tested)
    install = (repo / "docs" / "integrations.md").read_text().split("### Install", 1)[1].split("\n### ", 1)[0]
    assert ".[verl,vllm]" in install and "two environments" in install
