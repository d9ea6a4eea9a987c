"""``train.compile``: every decoder layer and the log-prob chunk through torch.compile (inductor, built on this CPU)
give the eager numbers within the stated tolerance: each metric within 1e-5 relative (+ `run_helpers.rounding_atol`
absolute: 1e-7, or 1e-6 of E[x^2] for the log-ratio variance, whose cancellation amplifies rounding), and the
gradient of the first step (AdamW's first moment after one step, (1 - beta1) g) within 1e-5 in relative norm.
Inductor fuses and reorders fp32 reductions (RMSNorm, softmax), so the bits differ: measured 3e-6 (metrics), 9e-7
(first gradient, AVX2 EPYC).
The weights after the steps are compared loosely (1e-3 in relative norm), because Adam's first steps are
~lr x sign(g): a coordinate whose gradient is at rounding level moves by +-lr on either side, so the weights'
distance counts such coordinates rather than measuring the gradients' error (2e-5 on an AVX-512 EPYC; on an
AVX2 one 9e-5 with the main environment's transformers, 1.4e-4 with 5.9, where CI once failed a 1e-4 bound)."""

import copy

import pytest
import torch
from test_microbatch_order import ADV, make_batch

from run_helpers import rounding_atol
from satrl.models import build_char_tokenizer, build_tiny_model
from satrl.objectives import resolve_objective
from satrl.training.settings import TrainerSettings
from satrl.training.trainer import Trainer

pytestmark = pytest.mark.slow  # inductor compiles each graph with the C++ compiler: minutes on a busy CPU


def test_compiled_trainer_equals_eager():
    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=2)
    runs = {}
    for compiled in (False, True):
        settings = TrainerSettings(lr=1e-2, microbatch_tokens=30, logprob_chunk_tokens=7, microbatch_order="by_length",
                                   compile=compiled)  # fmt: skip
        t = Trainer(copy.deepcopy(model), resolve_objective("sat_grpo"), settings)
        assert t.settings.compile == compiled
        metrics = [t.step(make_batch(tok, seed=0), ADV)]
        first_moment = {n: t.opt.state[p]["exp_avg"].clone() for n, p in t.model.named_parameters()}
        metrics.append(t.step(make_batch(tok, seed=1), ADV))
        weights = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        runs[compiled] = (metrics, first_moment, weights)
    (eager_m, eager_g, eager_w), (comp_m, comp_g, comp_w) = runs[False], runs[True]
    for a, b in zip(comp_m, eager_m):
        assert a.keys() == b.keys()
        for k in b:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=rounding_atol(b, k)), k
    assert eager_g.keys() == comp_g.keys()
    for k, g in eager_g.items():
        assert relative_distance(comp_g[k], g) <= 1e-5, k
    for k, v in eager_w.items():
        if v.is_floating_point():
            assert relative_distance(comp_w[k], v) <= 1e-3, k


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def test_compile_needs_decoder_layers():
    with pytest.raises(ValueError, match="train.compile"):
        Trainer(torch.nn.Linear(2, 2), resolve_objective("grpo"), TrainerSettings(lr=1e-3, compile=True))
