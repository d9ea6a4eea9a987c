"""The TRL plug-in (``satrl.integrations.trl``, extra ``trl``) against the real TRL, on CPU.

A tiny Qwen3 from satrl's builders and the char tokenizer are saved to a temporary directory; TRL loads
them from there (no hub). Without TRL these tests skip with the reason printed (``-ra``), except
``test_trl_is_installed_when_required``, which fails when ``SATRL_REQUIRE_TRL=1`` (set by ``make test``
and ``make test-verl``, whose environments install the extra).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from run_helpers import Extra
from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import aggregate, policy_loss

with Extra("TRL") as trl_extra:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from satrl.integrations.trl import SATGRPOConfig, SATGRPOTrainer
TRL_MISSING = trl_extra.missing


REQUIRED = os.environ.get("SATRL_REQUIRE_TRL") == "1"
needs_trl = pytest.mark.skipif(TRL_MISSING is not None, reason=str(TRL_MISSING))
PROMPTS = ["1+1=", "2+3=", "7-4=", "3*3=", "8/2=", "5+5=", "9-1=", "6*2="]
EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_trl_is_installed_when_required():
    if REQUIRED:
        assert TRL_MISSING is None, f"SATRL_REQUIRE_TRL=1 but {TRL_MISSING}"


_TINY: list[str] = []  # each module that imports the fixture has its own copy of it: one folder for all


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tiny policy's folder, saved once per test process (TRL only reads it); test_trl_vcpo.py and
    test_trl_baselines.py use it too."""
    if not _TINY:
        path = tmp_path_factory.mktemp("tiny-policy")
        tok = build_char_tokenizer()
        build_tiny_model(vocab_size=len(tok), seed=0).save_pretrained(path)
        tok.save_pretrained(path)
        _TINY.append(str(path))
    return _TINY[0]


def reward_digits(completions, **_):
    """Distinct rewards within a group (so advantages are not all 0): digits in the completion."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def config(cls, out, **kw):
    base = dict(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_steps=3, num_iterations=2, learning_rate=3e-5, logging_steps=1,
        report_to="none", save_strategy="no", seed=0, loss_type="grpo", epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH, dataloader_num_workers=0, disable_tqdm=True,
    )
    return cls(**{**base, **kw})


def trainer(cls, cfg_cls, tiny_dir, out, **kw):
    tok = build_char_tokenizer()
    return cls(model=tiny_dir, reward_funcs=reward_digits, args=config(cfg_cls, out, **kw),
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tok)


def stale_inputs(model, seed: int, b: int = 8, p: int = 4, t: int = 8, drift: float = 0.05):
    """One loss call's inputs as TRL builds them, with pi_old = pi + a per-sequence drift + token noise."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, 40, (b, p), generator=g)
    completion_ids = torch.randint(4, 40, (b, t), generator=g)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    completion_mask = (torch.arange(t) < lengths[:, None]).long()
    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompt_ids, completion_ids], 1)).logits[:, p - 1:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None]).squeeze(-1)
    old = logp + torch.randn(b, 1, generator=g) * drift + torch.randn(b, t, generator=g) * drift
    return {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": torch.randn(b, generator=g),
        "old_per_token_logps": old, "num_items_in_batch": completion_mask.sum(),
    }


def loss_and_grads(tr, inputs):
    tr.model.train()
    tr.model.zero_grad(set_to_none=True)
    tr.current_gradient_accumulation_steps = 1
    loss = tr._compute_loss(tr.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in tr.model.parameters()]


@pytest.fixture(scope="module")
def pair(tiny_dir, tmp_path_factory):
    """Factory: (TRL's GRPOTrainer, SATGRPOTrainer) on the same tiny model and settings."""
    out = tmp_path_factory.mktemp("trl-out")

    def make(level: str, loss_type: str, **sat):
        kw = dict(importance_sampling_level=level, loss_type=loss_type)
        return (trainer(GRPOTrainer, GRPOConfig, tiny_dir, out, **kw),
                trainer(SATGRPOTrainer, SATGRPOConfig, tiny_dir, out, **kw, **sat))
    return make


@needs_trl
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo"])
def test_gate_off_equals_trls_loss_bit_for_bit(pair, level, loss_type):
    """sat_alpha = 1: loss and every parameter gradient equal GRPOTrainer's (GSPO at sequence level)."""
    theirs, ours = pair(level, loss_type, sat_alpha=1.0)
    inputs = stale_inputs(theirs.model, seed=0, drift=0.3)  # large drift: TRL's clip is exercised
    loss, grads = loss_and_grads(ours, inputs)
    ref_loss, ref_grads = loss_and_grads(theirs, inputs)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert theirs._metrics["train"]["clip_ratio/region_mean"][-1] > 0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert ours._metrics["train"][key][-1] == theirs._metrics["train"][key][-1]
    assert ours._metrics["train"]["sat/gate_rate"][-1] == 0.0
    assert ours.epsilon_low == EPS_LOW and ours.epsilon_high == EPS_HIGH  # TRL's scalars restored


@needs_trl
@pytest.mark.parametrize("level,preset,proxy", [("token", "sat_grpo", "log_ratio"), ("token", "sat_grpo", "prob_diff"),
                                                ("sequence", "sat_gspo", "log_ratio")])
def test_gate_on_equals_satrl_objectives(pair, level, preset, proxy):
    """sat_alpha = 0.75 (loss_type grpo = seq-mean-token-mean): loss and gradients equal satrl's preset;
    bit for bit at token level; at sequence level the loss within 1e-6 and the gradients within 1e-5
    (relative), since TRL differentiates through the sequence mean and satrl uses GSPO's per-token form
    (same value and gradient, other rounding)."""
    _, ours = pair(level, "grpo", sat_alpha=0.75, sat_proxy=proxy)
    inputs = stale_inputs(ours.model, seed=1, drift=0.1)
    loss, grads = loss_and_grads(ours, inputs)
    mask = inputs["completion_mask"].bool()
    ours.model.zero_grad(set_to_none=True)
    # TRL's own log-probs (the base class's method: no SAT hook), with gradient
    logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        ours, ours.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))
    loss_tok, m, _ = policy_loss(preset, logp=logp, behavior_logp=inputs["old_per_token_logps"],
                              adv=inputs["advantages"], mask=mask, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                              alpha=0.75, proxy=proxy)
    ref_loss = aggregate(loss_tok, mask, "seq-mean-token-mean")
    ref_loss.backward()
    ref_grads = [p.grad for p in ours.model.parameters()]
    logged = ours._metrics["train"]
    assert logged["sat/gate_rate"][-1] == pytest.approx(float(m["gate_rate"])) and logged["sat/gate_rate"][-1] > 0
    assert logged["sat/q"][-1] == pytest.approx(float(m["q"]), rel=1e-6)
    if level == "token":
        assert torch.equal(loss, ref_loss.detach())
        assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    else:
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-9) for a, b in zip(grads, ref_grads))
    base, _ = pair(level, "grpo")
    base_loss, base_grads = loss_and_grads(base, inputs)
    assert not all(torch.equal(a, b) for a, b in zip(grads, base_grads))  # the gate changed the gradient


def train_logs(tr):
    tr.train()
    return [h for h in tr.state.log_history if "loss" in h], [p.detach().clone() for p in tr.model.parameters()]


@needs_trl
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_training_a_few_steps(tiny_dir, tmp_path, level):
    """End to end (generation, rewards, two iterations per batch, optimizer): SAT's gate off trains exactly
    as GRPOTrainer (same logs, same weights); gate on, SAT's metrics reach TRL's logs, the gate fires and
    the weights differ."""
    kw = dict(importance_sampling_level=level)
    ref_logs, ref_params = train_logs(trainer(GRPOTrainer, GRPOConfig, tiny_dir, tmp_path / "a", **kw))
    off_logs, off_params = train_logs(trainer(SATGRPOTrainer, SATGRPOConfig, tiny_dir, tmp_path / "b",
                                              sat_alpha=1.0, **kw))
    assert len(ref_logs) == 3
    assert all(torch.equal(a, b) for a, b in zip(off_params, ref_params))
    def untimed(h):  # wall-clock entries differ between any two runs
        return {k: v for k, v in h.items() if not k.startswith("sat/") and "time" not in k and "per_second" not in k}

    assert [untimed(h) for h in off_logs] == [untimed(h) for h in ref_logs]
    on_logs, on_params = train_logs(trainer(SATGRPOTrainer, SATGRPOConfig, tiny_dir, tmp_path / "c",
                                            sat_alpha=0.75, **kw))
    assert all({"sat/q", "sat/gate_rate", "sat/eps_low_mean", "sat/eps_high_mean", "sat/c_min"} <= set(h)
               for h in on_logs)
    assert max(h["sat/gate_rate"] for h in on_logs) > 0
    assert all(h["sat/eps_high_mean"] <= EPS_HIGH + 1e-6 for h in on_logs)  # fp32 radii
    assert not all(torch.equal(a, b) for a, b in zip(on_params, ref_params))


@needs_trl
def test_sequence_gate_that_cannot_fire_warns_once(pair):
    """8 sequences of 8 tokens: alpha = 0.9 gates at most 64 - 58 = 6 tokens, less than one sequence."""
    _, ours = pair("sequence", "grpo", sat_alpha=0.9)
    inputs = stale_inputs(ours.model, seed=2)
    inputs["completion_mask"] = torch.ones_like(inputs["completion_mask"])
    from satrl.integrations import _gate

    _gate._warned_gate.clear()
    with pytest.warns(RuntimeWarning, match=r"SATGRPOTrainer: .* at most n - ceil\(alpha\*n\) = 6 of its n = 64"):
        loss_and_grads(ours, inputs)
    assert ours._metrics["train"]["sat/gate_rate"][-1] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_and_grads(ours, inputs)
    _gate._warned_gate.clear()


@needs_trl
@pytest.mark.parametrize("keys,match", [
    ({"loss_type": "cispo"}, "no clip interval"),
    ({"sat_proxy": "version_age"}, "sat_proxy"),
    ({"sat_proxy": "prob_diff", "importance_sampling_level": "sequence"}, "needs importance_sampling_level"),
    ({"epsilon": 0.6}, r"epsilon=0.6 must be in \[0, 0.5\]"),
    ({"sat_alpha": 1.5}, "alpha"),
])
def test_bad_config_is_refused(tmp_path, keys, match):
    with pytest.raises(ValueError, match=match):
        config(SATGRPOConfig, tmp_path, **keys)


@needs_trl
def test_trainer_needs_the_sat_config(tiny_dir, tmp_path):
    with pytest.raises(TypeError, match="SATGRPOConfig"):
        trainer(SATGRPOTrainer, GRPOConfig, tiny_dir, tmp_path)


@needs_trl
def test_a_trl_whose_loss_skips_the_hook_is_refused(pair, monkeypatch):
    """If a TRL version stopped computing log-probs through the hooked method, SAT would silently not
    apply: the trainer raises instead."""
    _, ours = pair("token", "grpo")
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, model, inputs: torch.zeros(()))
    with pytest.raises(RuntimeError, match="not supported by satrl.integrations.trl"):
        ours._compute_loss(ours.model, stale_inputs(ours.model, seed=3))
    assert ours.epsilon_low == EPS_LOW  # TRL's scalars restored


def with_sampling(model, seed: int, gap: float = 0.5):
    """``stale_inputs`` plus vLLM-style sampling log-probs: pi_old = pi + a small drift (0.05), while the
    engine's log-probs are pi + a large token noise (``gap``), as when the engine's kernels differ."""
    inputs = stale_inputs(model, seed=seed, drift=0.05)
    g = torch.Generator().manual_seed(seed + 100)
    inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] + torch.randn(
        inputs["old_per_token_logps"].shape, generator=g) * gap
    return inputs


def sat_reference(tr, inputs, behavior):
    """satrl's sat_grpo metrics for this call with ``behavior`` as mu (TRL's own log-probs, no hook)."""
    logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        tr, tr.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))
    _, m, _ = policy_loss("sat_grpo", logp=logp.detach(), behavior_logp=behavior, adv=inputs["advantages"],
                          mask=inputs["completion_mask"].bool(), eps_low=EPS_LOW, eps_high=EPS_HIGH,
                          alpha=0.75)
    return float(m["q"]), float(m["gate_rate"])


@needs_trl
@pytest.mark.parametrize("mu_source,side,flag", [("auto", "sampling", 1.0), ("sampling", "sampling", 1.0),
                                                 ("old_policy", "old", 0.0)])
def test_gate_follows_the_chosen_mu(tiny_dir, tmp_path, mu_source, side, flag):
    """Sampling log-probs far from pi_old: SAT's q and gate rate are satrl's with the chosen mu, not the
    other one, and sat/mu_source says which."""
    tr = trainer(SATGRPOTrainer, SATGRPOConfig, tiny_dir, tmp_path, sat_alpha=0.75)
    tr.mu_source = mu_source  # as SATGRPOTrainer(..., mu_source=...) sets it (one model load for all three)
    inputs = with_sampling(tr.model, seed=4)
    loss_and_grads(tr, inputs)
    keys = {"sampling": "sampling_per_token_logps", "old": "old_per_token_logps"}
    q, rate = sat_reference(tr, inputs, inputs[keys[side]])
    q_other, _ = sat_reference(tr, inputs, inputs[keys["old" if side == "sampling" else "sampling"]])
    logged = tr._metrics["train"]
    assert logged["sat/q"][-1] == pytest.approx(q, rel=1e-6) and abs(q - q_other) > 0.1
    assert logged["sat/gate_rate"][-1] == pytest.approx(rate) and rate > 0
    assert logged["sat/mu_source"][-1] == flag


@needs_trl
def test_mu_source_without_sampling_log_probs(tiny_dir, tmp_path):
    """Generation without vLLM leaves no sampling log-probs: auto falls back to the old policy (logged 0),
    sampling refuses, an unknown source is refused when the trainer is built."""
    with pytest.raises(ValueError, match=r"mu_source='vllm'\); choose one of"):
        SATGRPOTrainer(model=tiny_dir, reward_funcs=reward_digits, args=config(SATGRPOConfig, tmp_path),
                       mu_source="vllm")
    tr = trainer(SATGRPOTrainer, SATGRPOConfig, tiny_dir, tmp_path, sat_alpha=0.75)
    assert tr.mu_source == "auto"
    inputs = stale_inputs(tr.model, seed=5, drift=0.1)
    loss_and_grads(tr, inputs)
    assert tr._metrics["train"]["sat/mu_source"][-1] == 0.0
    assert tr._metrics["train"]["sat/q"][-1] == pytest.approx(sat_reference(tr, inputs, inputs["old_per_token_logps"])[0],
                                                             rel=1e-6)
    tr.mu_source = "sampling"
    with pytest.raises(RuntimeError, match="has no sampling log-probs"):
        loss_and_grads(tr, inputs)


@needs_trl
def test_sampling_mu_without_a_generator_that_has_log_probs_is_refused_before_the_model_loads(tiny_dir, tmp_path,
                                                                                              monkeypatch):
    """mu_source="sampling" needs vLLM (use_vllm=True) or a rollout_func: without either, SATGRPOTrainer
    refuses before TRL loads the model (here a path that does not exist), given by keyword or by position."""
    missing = str(tmp_path / "no-model")
    refused = r"mu_source='sampling'\) needs the generator's sampling log-probs.*use_vllm=True"
    with pytest.raises(ValueError, match=refused):
        SATGRPOTrainer(model=missing, reward_funcs=reward_digits, args=config(SATGRPOConfig, tmp_path),
                       mu_source="sampling")
    with pytest.raises(ValueError, match=refused):
        SATGRPOTrainer(missing, reward_digits, config(SATGRPOConfig, tmp_path), mu_source="sampling")
    # vLLM generates: not refused by satrl (what fails next is TRL's own loading of the missing model or vLLM)
    with pytest.raises(Exception) as other:
        SATGRPOTrainer(model=missing, reward_funcs=reward_digits, mu_source="sampling",
                       args=config(SATGRPOConfig, tmp_path, use_vllm=True))
    assert "mu_source" not in str(other.value)

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that rollout_func is experimental

    def rollout_func(prompts, trainer):  # a generator that returns its log-probs (never called here)
        raise AssertionError("not called")

    tr = SATGRPOTrainer(model=tiny_dir, reward_funcs=reward_digits, args=config(SATGRPOConfig, tmp_path),
                        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_char_tokenizer(),
                        rollout_func=rollout_func, mu_source="sampling")
    assert tr.mu_source == "sampling"


ENGINE_CASES = {  # how the batch carries TRL's pi_old and vLLM importance-sampling weight besides mu
    "rollout_func": {},  # num_iterations=1: TRL has no pi_old (its ratio would be 1)
    "pi_old_and_a_nan_mu": {"old": True, "nan": True},
    "vllm_sequence_mask": {"old": True, "is_mode": "sequence_mask"},
    "vllm_token_truncate": {"old": True, "is_mode": "token_truncate"},
}


def engine_inputs(tr, seed: int, case: dict) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """``with_sampling`` shaped as TRL hands it over in ``case``; returns (inputs, mu, keep): the mu SAT should
    use, and the rejection TRL's IS mask keeps (ones unless a mask mode rejects)."""
    inputs = with_sampling(tr.model, seed=seed)
    mask = inputs["completion_mask"].bool()
    if case.get("nan"):  # vLLM's None log-prob: that token's mu is pi_old
        inputs["sampling_per_token_logps"][0, 1] = float("nan")
    if not case.get("old"):
        del inputs["old_per_token_logps"]
    logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        tr, tr.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))
    old = inputs.get("old_per_token_logps", logp.detach())
    mu = torch.where(torch.isfinite(inputs["sampling_per_token_logps"]), inputs["sampling_per_token_logps"], old)
    keep = torch.ones(mask.shape[0], 1)
    tr.use_vllm = tr.vllm_importance_sampling_correction = "is_mode" in case  # only the IS product reads them
    if "is_mode" in case:
        tr.vllm_importance_sampling_mode = case["is_mode"]
        # TRL's pi_old / mu weight, with one sequence rejected (0) where the mode masks
        weight = torch.tensor([[0.7], [0.0], [1.3], [2.0], [0.5], [1.0], [0.9], [1.1]])
        if case["is_mode"] == "sequence_mask":
            keep = (weight != 0).float()
        else:
            weight = weight.clamp(min=0.25).expand_as(mu).contiguous()
        inputs["importance_sampling_ratio"] = weight
    return inputs, mu, keep


@needs_trl
@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_engine_mu_is_the_ratios_denominator(pair, case):
    """mu = the engine's log-probs: TRL's ratio is pi / mu (verl's bypass mode), so the loss and every gradient
    equal satrl's sat_grpo with behavior_logp = mu, bit for bit, with TRL's vLLM IS weight dropped but its mask
    kept; gate off, they equal GRPOTrainer's given mu as its old_per_token_logps (and no IS weight)."""
    theirs, ours = pair("token", "grpo", sat_alpha=0.75)
    inputs, mu, keep = engine_inputs(ours, seed=6, case=ENGINE_CASES[case])
    before = dict(inputs)
    loss, grads = loss_and_grads(ours, inputs)
    assert inputs.keys() == before.keys() and all(inputs[k] is before[k] for k in inputs)  # caller's batch kept
    assert ours._metrics["train"]["sat/mu_source"][-1] == 1.0 and ours._metrics["train"]["sat/gate_rate"][-1] > 0
    mask = inputs["completion_mask"].bool()
    ours.model.zero_grad(set_to_none=True)
    logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        ours, ours.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].size(1))
    loss_tok, _, _ = policy_loss("sat_grpo", logp=logp, behavior_logp=mu, adv=inputs["advantages"], mask=mask,
                                 eps_low=EPS_LOW, eps_high=EPS_HIGH, alpha=0.75)
    ref_loss = aggregate(loss_tok * keep, mask, "seq-mean-token-mean")
    ref_loss.backward()
    assert torch.equal(loss, ref_loss.detach())
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, ours.model.parameters()))
    # gate off: TRL's own loss on pi / mu
    ours.args.sat_alpha = 1.0
    off_loss, off_grads = loss_and_grads(ours, inputs)
    ours.args.sat_alpha = 0.75
    bypass = {k: v for k, v in inputs.items() if k not in ("sampling_per_token_logps", "importance_sampling_ratio")}
    bypass["old_per_token_logps"] = mu
    ref_off, ref_off_grads = loss_and_grads(theirs, bypass)
    if "is_mode" in ENGINE_CASES[case]:  # TRL's loss times the kept rows' 0/1: compare on the kept rows only
        theirs.use_vllm = theirs.vllm_importance_sampling_correction = True
        ref_off, ref_off_grads = loss_and_grads(theirs, {**bypass, "importance_sampling_ratio": keep})
        theirs.use_vllm = theirs.vllm_importance_sampling_correction = False
    assert torch.equal(off_loss, ref_off)
    assert all(torch.equal(a, b) for a, b in zip(off_grads, ref_off_grads))
    assert not torch.equal(off_loss, loss_and_grads(theirs, inputs)[0])  # TRL itself: another ratio


def noisy_rollout(noise: float = 0.3, t: int = 8):
    """A ``rollout_func`` (TRL's custom generator): random completions, and as their sampling log-probs the
    policy's at generation plus a token noise (an engine whose numerics differ). Seeded: two trainers built
    with their own ``noisy_rollout()`` see the same completions."""
    g = torch.Generator().manual_seed(0)

    def rollout_func(prompts, trainer):
        prompt_ids = [trainer.processing_class(p)["input_ids"] for p in prompts]
        completion_ids = [torch.randint(4, 40, (t,), generator=g).tolist() for _ in prompts]
        logprobs = []
        with torch.no_grad():
            for p, c in zip(prompt_ids, completion_ids):
                logits = trainer.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].float()
                logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
                logprobs.append((logp + torch.randn(t, generator=g) * noise).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
    return rollout_func


@needs_trl
def test_sat_acts_at_trls_defaults_with_an_engine_mu(tiny_dir, tmp_path, monkeypatch):
    """The issue's run: 3 steps, num_iterations=1 (TRL's default: pi_old = pi), a rollout_func whose log-probs
    differ from pi. SAT's ratio is pi / mu, so TRL's clip counts clipped tokens, the gate fires and the weights
    are not GRPOTrainer's (they were bit-identical while SAT clipped pi / pi_old = 1); no warning."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")

    def build(cls, cfg_cls, out, **kw):
        return cls(model=tiny_dir, reward_funcs=reward_digits, args=config(cfg_cls, out, num_iterations=1, **kw),
                   train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_char_tokenizer(),
                   rollout_func=noisy_rollout())

    _, ref_params = train_logs(build(GRPOTrainer, GRPOConfig, tmp_path / "a"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        logs, params = train_logs(build(SATGRPOTrainer, SATGRPOConfig, tmp_path / "b", sat_alpha=0.9))
    assert len(logs) == 3 and all(h["sat/mu_source"] == 1.0 for h in logs)
    assert min(h["sat/gate_rate"] for h in logs) > 0 and min(h["clip_ratio/region_mean"] for h in logs) > 0
    assert not all(torch.equal(a, b) for a, b in zip(params, ref_params))


@needs_trl
@pytest.mark.parametrize("keys,sat_acts", [
    ({"num_iterations": 1}, False),                                    # TRL's default: pi_old = pi, no mu
    ({"num_iterations": 1, "gradient_accumulation_steps": 2}, False),  # steps_per_generation follows: aligned
    ({"num_iterations": 2}, True),                                     # batches reused after a step
    ({"num_iterations": 1, "rollout": True}, True),                    # the engine's mu
    ({"num_iterations": 1, "rollout": True, "mu_source": "old_policy"}, False),
])
def test_a_sat_that_cannot_act_says_so_when_built(tiny_dir, tmp_path, monkeypatch, keys, sat_acts):
    """Without an engine mu, and with TRL's ratio pi / pi_old identically 1, one RuntimeWarning when the
    trainer is built; none otherwise."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    keys = dict(keys)
    extra = {"rollout_func": noisy_rollout()} if keys.pop("rollout", False) else {}
    extra["mu_source"] = keys.pop("mu_source", "auto")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        SATGRPOTrainer(model=tiny_dir, reward_funcs=reward_digits, args=config(SATGRPOConfig, tmp_path, **keys),
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=build_char_tokenizer(),
                       **extra)
    ours = [str(w.message) for w in seen if "SAT will not act" in str(w.message)]
    assert len(ours) == (0 if sat_acts else 1)
    if ours:
        assert "\n" not in ours[0] and f"num_iterations={keys['num_iterations']}" in ours[0]
