"""Trainer: the non-finite guard, per-token log-probs, the d = Delta_pi + Delta_impl split on real outputs."""

import copy

import pytest
import torch

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import resolve_objective
from satrl.pipeline.buffer import collate
from satrl.training.logprobs import response_logp
from satrl.training.microbatches import microbatches
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer
from satrl.types import Sample


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def make_batch(tok, n=6, version=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        prompt = tok(f"{i}{i}+{i}=")["input_ids"]
        resp = torch.randint(3, len(tok), (2 + i % 3,), generator=g).tolist()
        samples.append(Sample(f"s{i}", f"g{i // 3}", prompt, resp, -torch.rand(len(resp), generator=g), version, float(i % 2)))
    return collate(samples, tok.pad_token_id)


def make_trainer(model, name="sat_grpo", **kw):
    return Trainer(copy.deepcopy(model), resolve_objective(name), TrainerSettings(lr=1e-2, **kw))


def test_response_logp_matches_manual_forward(tiny):
    model, tok = tiny
    batch = make_batch(tok)
    logp, _ = response_logp(model, batch, temperature=0.7)
    for b in range(3):
        p, t = int(batch.prompt_len[b]), int(batch.mask[b].sum())
        ids = batch.input_ids[b : b + 1, : p + t]
        ref = torch.log_softmax(model(input_ids=ids).logits[0].float() / 0.7, -1)
        expect = ref[p - 1 : p + t - 1].gather(-1, ids[0, p:, None]).squeeze(-1)
        torch.testing.assert_close(logp[b, :t], expect, atol=1e-5, rtol=1e-5)


def test_nonfinite_step_is_skipped_and_leaves_weights_untouched(tiny):
    model, tok = tiny
    trainer = make_trainer(model)
    batch = make_batch(tok)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    trainer.step(batch, adv)  # one healthy step so the optimizer has state
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt_before = copy.deepcopy(trainer.opt.state_dict())
    bad = adv.clone()
    bad[2] = float("nan")  # a non-finite advantage on an active token poisons the loss
    metrics = trainer.step(batch, bad)
    assert metrics["skipped"] == 1.0 and trainer.skipped == 1 and trainer.version == 2
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    after = trainer.opt.state_dict()
    for pid, st in opt_before["state"].items():
        assert torch.equal(st["exp_avg"], after["state"][pid]["exp_avg"])
    metrics = trainer.step(batch, adv)
    assert metrics["skipped"] == 0.0
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


def test_microbatch_accumulation_equals_one_big_batch(tiny):
    model, tok = tiny
    batch = make_batch(tok)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    big = make_trainer(model, name="grpo", grad_clip=None)
    small = make_trainer(model, name="grpo", grad_clip=None, microbatch_tokens=10)
    assert len(list(microbatches(batch, 10))) > 2
    for t in (big, small):  # plain SGD: the weight change is the gradient itself (Adam would hide scale)
        t.opt = torch.optim.SGD(t.model.parameters(), lr=1.0)
    big.step(batch, adv)
    small.step(batch, adv)
    for (k, a), b in zip(big.model.state_dict().items(), small.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_snapshot_of_the_current_weights_gives_the_current_logp_bit_for_bit(tiny, dtype):
    """At lag 0 the policy term of d = Delta_pi + Delta_impl is zero: a snapshot forward must run the policy's
    own numerics. Under bf16 autocast, weights cast to bf16 before the forward (as the snapshot path once did)
    change the norms and the embedding, and read as a policy lag of about 0.01 nats that does not exist."""
    model, tok = tiny
    trainer = make_trainer(model, dtype=dtype)
    batch = make_batch(tok)
    trainer.step(batch, torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0]))
    assert torch.equal(trainer.logp_with(trainer.export.weights(), batch), trainer.logp_with(None, batch))


def test_decomposition_identity_on_trainer_outputs(tiny):
    from satrl.diagnostics import decompose_mismatch

    model, tok = tiny
    trainer = make_trainer(model)
    batch = make_batch(tok)
    snapshot = trainer.export.weights()
    for _ in range(2):
        trainer.step(batch, torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0]))
    logp_now = trainer.logp_with(None, batch)
    logp_v = trainer.version_logp(batch, {0: snapshot}.get)
    dec = decompose_mismatch(logp_now, logp_v, batch.behavior_logp, batch.mask)
    d = torch.where(batch.mask, logp_now.double() - batch.behavior_logp.double(), 0.0)
    assert torch.equal(dec["tok/delta_pi"] + dec["tok/delta_impl"], d)
    assert float(dec["d_policy"]) > 0


def test_r3_without_engine_routing_refuses():
    """r3=true with samples that carry no routing (an engine that could not capture it) must fail loudly:
    replaying nothing would silently train without R3."""
    tok = build_char_tokenizer()
    moe = build_tiny_model("moe", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    trainer = make_trainer(moe, "grpo", r3=True)
    batch = make_batch(tok)
    assert batch.routing is None
    with pytest.raises(ValueError, match="r3=true but these samples carry no MoE routing"):
        trainer.step(batch, torch.ones(batch.mask.shape[0]))


def test_extreme_metrics_reduce_as_extremes_over_many_microbatches(tiny, monkeypatch):
    """c_min is the smallest contraction among gated tokens: below 1/2 whenever any token is gated
    (psi(u; q) = 1 / (1 + (u/q)^2) < 1/2 for u > q). Averaged over microbatches, the ungated ones (c_min = 1)
    pushed it above 1/2; reduced as a minimum, it holds. The mean-reduction run shows the test can fail."""
    from satrl.objectives import reductions

    model, tok = tiny
    batch = make_batch(tok, n=24, seed=3)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 6)
    # 8 microbatches of 4-12 tokens: a 0.9-quantile gate can fire only in those with >= 10 tokens
    assert len(list(microbatches(batch, 40))) == 8

    def c_min_and_gate():
        out = make_trainer(model, microbatch_tokens=40).step(batch, adv)
        return out["obj/c_min"], out["obj/gate_rate"]

    c_min, gate = c_min_and_gate()
    assert gate > 0 and c_min < 0.5
    monkeypatch.setattr(reductions, "REDUCTIONS", {})  # every metric a token mean, as before the fix
    wrong, _ = c_min_and_gate()
    assert wrong > 0.5


def test_every_extreme_metric_declares_its_reduction():
    from satrl.objectives import available_presets, policy_loss
    from satrl.objectives.reductions import REDUCTIONS, reduction_of

    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 8, generator=g) * 0.1 - 2
    blp = logp + 0.05 * torch.randn(4, 8, generator=g)
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(4, 8, dtype=torch.bool)
    seen = set()
    for name in available_presets():
        _, m, _ = policy_loss(name, logp=logp.clone().requires_grad_(), behavior_logp=blp, adv=adv, mask=mask,
                              ref_logp=logp, lag=torch.ones(4, 8, dtype=torch.long))  # fmt: skip
        assert all(v.dim() == 0 for v in m.values()), name  # per-token tensors come apart, in out.tokens
        seen |= set(m)
    for k in seen:
        if k.endswith(("_min", "_max")):
            assert reduction_of(k) in ("min", "max"), k
    assert set(REDUCTIONS) <= seen  # no stale declarations


@pytest.mark.parametrize("microbatch_tokens", [4096, 60])  # one microbatch; six
def test_objective_token_outputs_reach_the_step_diagnostics(tiny, microbatch_tokens):
    """The trainer reads the objective's per-token outputs (out.tokens: d, gate, clipped) into the step's
    diagnostics, across microbatches: one d_pi (mismatch/d_pi, from tokens.d; the objective has none), and
    per-lag gate and clip rates that agree with the objective's own (token-mean) rates."""
    model, tok = tiny
    batch = make_batch(tok, n=24, seed=3)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 6)
    trainer = make_trainer(model, microbatch_tokens=microbatch_tokens)
    logp = trainer.logp_with(None, batch)  # the weights the step's forward sees
    out = trainer.step(batch, adv)
    assert "obj/d_pi" not in out and not any(k.startswith(("obj/tok", "tok/")) for k in out)
    d = (logp - batch.behavior_logp)[batch.mask]
    assert out["mismatch/d_pi"] == pytest.approx(float(d.abs().mean()), rel=1e-5)
    assert out["mismatch/d_max_abs"] == pytest.approx(float(d.abs().max()), rel=1e-5)
    assert out["obj/gate_rate"] > 0 and out["obj/clipfrac"] > 0  # the gate and the clip acted
    # every token is at lag 0 here: the per-lag rates are the whole step's
    assert out["bylag/0/gate_rate"] == pytest.approx(out["obj/gate_rate"], rel=1e-6)
    assert out["bylag/0/clipfrac"] == pytest.approx(out["obj/clipfrac"], rel=1e-6)
    assert 0 < out["gate/tv_share"] <= 1


def test_tf32_is_set_where_the_program_starts_never_by_a_trainer(tiny, tmp_path, monkeypatch):
    from benchmarks._tiny import TINY

    from satrl.config import load_config
    from satrl.dtypes import set_tf32
    from satrl.loop import orchestrator

    model, _ = tiny
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for on in (True, False):  # process-wide switches: building a trainer leaves them as the program set them
            set_tf32(on)
            Trainer(copy.deepcopy(model), resolve_objective("grpo"), TrainerSettings(lr=1e-3))
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
    finally:
        set_tf32(before)
    seen = []

    class Started(Exception):
        pass

    def record(on: bool) -> None:
        seen.append(on)
        raise Started

    monkeypatch.setattr(orchestrator, "set_tf32", record)
    with pytest.raises(Started):
        orchestrator.train(load_config(None, [*TINY, "train.tf32=false", f"out={tmp_path / 'run'}"]))
    assert seen == [False]


def test_moved_trainer_names_still_work_and_warn_once(tiny):
    """Issue 61 moved the weights, shards and score passes out of the Trainer: the old names still answer (the
    same object's attribute), with one DeprecationWarning each; an unknown name is still an AttributeError."""
    import warnings

    from satrl.training import trainer as trainer_mod

    model, _ = tiny
    trainer = make_trainer(model)
    trainer_mod._warned.clear()
    for old, (part, new) in trainer_mod.MOVED.items():
        with pytest.warns(DeprecationWarning, match=f"trainer.{part}.{new}"):
            got = getattr(trainer, old)
        assert got == getattr(getattr(trainer, part), new)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            getattr(trainer, old)  # the second time: silent
    assert trainer.weights() is trainer.export.weights()
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = trainer.nothing_here
