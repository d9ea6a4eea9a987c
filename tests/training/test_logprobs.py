"""The trainer's lean paths equal its plain one: chunked log-probs, the host-built attention mask, activation
checkpointing, bf16 autocast; the reference model and the snapshot forward only when needed."""

import copy

import pytest
import torch
from test_trainer import make_batch, make_trainer

from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.training.logprobs import response_logp
from satrl.training.microbatches import plan_microbatches
from satrl.training.settings import TrainerSettings

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2), tok


def _host_facts(batch):
    (p,) = plan_microbatches(batch, 1 << 30)
    return p.longest, p.padded


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_chunked_logp_equals_full_logits_path(tiny, chunk):
    model, tok = tiny
    batch = make_batch(tok, n=9, seed=2)
    length, padded = _host_facts(batch)
    assert padded  # rows of different lengths: the 4-D mask path is exercised too
    full, _ = response_logp(model, batch, 0.7)
    same, _ = response_logp(model, batch, 0.7, length=length, padded=padded)
    assert torch.equal(same, full)  # the host-built mask is transformers' own: bit for bit
    got, _ = response_logp(model, batch, 0.7, length=length, padded=padded, chunk_tokens=chunk)
    torch.testing.assert_close(got[batch.mask], full[batch.mask], atol=1e-6, rtol=1e-6)
    wrong, _ = response_logp(model, batch, 1.0, length=length, padded=padded, chunk_tokens=chunk)
    assert not torch.allclose(wrong[batch.mask], full[batch.mask], atol=1e-3)  # the temperature is folded in


def test_unpadded_microbatch_takes_the_causal_kernel_bit_for_bit(tiny):
    model, tok = tiny
    batch = make_batch(tok, n=1, seed=3)
    length, padded = _host_facts(batch)
    assert not padded
    full, _ = response_logp(model, batch, 0.7)
    assert torch.equal(response_logp(model, batch, 0.7, length=length, padded=padded)[0], full)


def test_chunked_logp_gradients_equal_full_path(tiny):
    model, tok = tiny
    batch = make_batch(tok, n=6, seed=4)
    grads = []
    for chunk in (0, 4):
        m = copy.deepcopy(model).train()
        logp, _ = response_logp(m, batch, 0.9, chunk_tokens=chunk)
        torch.where(batch.mask, logp, 0.0).sum().backward()
        grads.append({k: p.grad for k, p in m.named_parameters()})
    for k, g in grads[0].items():  # to fp32 rounding of the largest entry (the embedding's grad reaches ~7)
        torch.testing.assert_close(grads[1][k], g, atol=1e-6 * float(g.abs().max()), rtol=1e-5, msg=k)


def _grads_after_step(model, tok, **kw):
    trainer = make_trainer(model, "sat_grpo", grad_clip=None, microbatch_tokens=30, **kw)
    trainer.opt = torch.optim.SGD(trainer.model.parameters(), lr=1.0)  # the weight change is the gradient
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.step(make_batch(tok), ADV)
    return metrics, {k: before[k] - v for k, v in trainer.model.state_dict().items()}


def test_activation_checkpointing_gives_the_same_gradients(tiny):
    model, tok = tiny
    plain_m, plain = _grads_after_step(model, tok)
    ckpt_m, ckpt = _grads_after_step(model, tok, activation_checkpointing=True, logprob_chunk_tokens=7)
    assert ckpt_m["loss"] == pytest.approx(plain_m["loss"], rel=1e-5, abs=1e-7)
    assert any(g.abs().max() > 0 for g in plain.values())
    for k, g in plain.items():
        torch.testing.assert_close(ckpt[k], g, atol=1e-6, rtol=1e-4, msg=k)


def test_activation_checkpointing_is_on_in_the_model(tiny):
    model, _ = tiny
    def on(m):
        return any(getattr(x, "gradient_checkpointing", False) for x in m.modules())

    assert on(make_trainer(model, activation_checkpointing=True).model)
    assert not on(make_trainer(model).model)


def test_bf16_autocast_runs_close_to_fp32_with_fp32_master_weights(tiny):
    model, tok = tiny
    fp32_m, fp32 = _grads_after_step(model, tok)
    bf16_m, bf16 = _grads_after_step(model, tok, dtype="bf16", logprob_chunk_tokens=16)
    assert torch.isfinite(torch.tensor(bf16_m["loss"])) and bf16_m["skipped"] == 0.0
    assert bf16_m["loss"] != fp32_m["loss"]  # bf16 did run: the numbers moved
    assert bf16_m["loss"] == pytest.approx(fp32_m["loss"], abs=2e-2)
    trainer = make_trainer(model, "sat_grpo", dtype="bf16")
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights
    trainer.step(make_batch(tok), ADV)
    assert all(s.dtype == torch.float32 for st in trainer.opt.state.values() for s in st.values() if s.numel() > 1)
    num = sum(float((bf16[k] - fp32[k]).norm()) for k in fp32)
    den = sum(float(fp32[k].norm()) for k in fp32)
    assert num / den < 0.1  # the same update direction, to bf16's precision


def test_reference_model_only_with_a_kl_term_and_in_the_compute_dtype(tiny):
    model, _ = tiny
    from satrl.objectives import resolve_objective
    from satrl.training.trainer import Trainer

    bf16 = TrainerSettings(lr=1e-2, dtype="bf16")
    with_kl = Trainer(copy.deepcopy(model), resolve_objective("grpo", kl_coef=1e-3), bf16)
    zero_kl = Trainer(copy.deepcopy(model), resolve_objective("grpo", kl_coef=0.0), TrainerSettings(lr=1e-2))
    assert zero_kl.ref_model is None
    ref = with_kl.ref_model
    assert ref is not None and not ref.training
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in ref.parameters())
    assert all(id(p) not in {id(q) for g in with_kl.opt.param_groups for q in g["params"]} for p in ref.parameters())


def test_snapshot_forward_keeps_no_weight_copy_and_equals_a_loaded_copy(tiny):
    """The Δπ/Δimpl forward swaps a snapshot's tensors into the policy for the call: the result equals the
    old scratch copy's bit for bit, and the trainer holds no second model afterwards."""
    model, tok = tiny
    trainer = make_trainer(model)
    batch = make_batch(tok)
    snapshot = trainer.export.weights()
    trainer.step(batch, ADV)
    got = trainer.version_logp(batch, {0: snapshot}.get)
    scratch = copy.deepcopy(trainer.model).eval()
    scratch.load_state_dict(snapshot)
    expect, _ = response_logp(scratch, batch, trainer.settings.temperature)
    assert torch.equal(got[batch.mask], expect[batch.mask])
    now, _ = response_logp(trainer.model, batch, trainer.settings.temperature)
    assert not torch.equal(now[batch.mask], expect[batch.mask])  # the snapshot really was swapped in
    held = [k for k, v in vars(trainer).items() if isinstance(v, torch.nn.Module) and k not in ("model", "ref_model")]
    assert held == []


def test_no_snapshot_forward_when_decompose_is_off(tiny):
    model, tok = tiny
    calls = []

    def snapshots(v):
        calls.append(v)
        return None

    batch = make_batch(tok)
    batch.rewards = ADV.clone()
    for decompose in (False, True):
        trainer = make_trainer(model, decompose=decompose)
        list(trainer.train_batch(batch, 0, snapshots, stop_at=1))
        assert bool(calls) == decompose  # the check can fail: with decompose on, snapshots are asked for


def test_config_fields_reach_the_trainer():
    from satrl.config import load_config
    from satrl.launch.setup import build_trainer

    over = ["train.dtype=bf16", "train.activation_checkpointing=true", "train.logprob_chunk_tokens=64",
            "objective.name=sat_grpo", "objective.kl_coef=0", "diagnostics.decompose=false"]  # fmt: skip
    trainer, _ = build_trainer(load_config(None, over))
    assert (trainer.settings.dtype, trainer.scorer.chunk_tokens, trainer.ref_model) == ("bf16", 64, None)
    assert any(getattr(m, "gradient_checkpointing", False) for m in trainer.model.modules())
    plain, _ = build_trainer(load_config(None, []))
    assert (plain.settings.dtype, plain.scorer.chunk_tokens) == ("fp32", 0)


def test_snapshot_forward_in_bf16_is_close_to_fp32(tiny):
    """Under bf16 the snapshot's weights are cast for the forward; the log-probs stay close to fp32's."""
    model, tok = tiny
    batch = make_batch(tok)
    got = {}
    for dtype in ("fp32", "bf16"):
        trainer = make_trainer(model, dtype=dtype, logprob_chunk_tokens=8)
        got[dtype] = trainer.version_logp(batch, {0: {k: v.clone() for k, v in model.state_dict().items()}}.get)
    assert torch.isfinite(got["bf16"][batch.mask]).all()
    assert not torch.equal(got["bf16"], got["fp32"])
    torch.testing.assert_close(got["bf16"][batch.mask], got["fp32"][batch.mask], atol=0.1, rtol=0.05)
