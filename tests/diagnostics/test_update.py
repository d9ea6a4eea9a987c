"""update/* diagnostics (satrl.diagnostics.update), by hand: ESS of the sequence weights and the advantage mass's
positive share; and that every objective's step logs them."""

import math

import pytest
import torch

from satrl.diagnostics.update import update_stats

LN2 = math.log(2.0)


def test_hand_derived_ess_and_positive_share():
    # w = 1, 2, 1/2 (d split over active tokens; the masked position holds junk); row 3 has no active token
    d = torch.tensor([[0.0, 0.0, 9.0], [LN2 / 2, LN2 / 2, 9.0], [-LN2, 0.0, 9.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 2.0, 7.0])
    out = update_stats(d, mask, adv)
    ess = (1 + 2 + 0.5) ** 2 / (1 + 4 + 0.25)
    assert float(out["ess_ratio"]) == pytest.approx(ess / 3)
    # mass |A| n: 1*2 (+), 0.5*2 (-), 2*1 (+), row 3 none
    assert float(out["adv_pos_share"]) == pytest.approx(4 / 5)
    token_adv = adv[:, None].expand(-1, 3).clone()
    token_adv[~mask] = 100.0  # only the active tokens' advantages count
    assert float(update_stats(d, mask, token_adv)["adv_pos_share"]) == pytest.approx(4 / 5)


def test_equal_weights_give_ess_ratio_one_and_every_objective_logs_update_keys():
    import copy

    from satrl.models import build_char_tokenizer, build_tiny_model
    from satrl.objectives import resolve_objective
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    d = torch.zeros(4, 3)
    assert float(update_stats(d, torch.ones(4, 3, dtype=torch.bool), torch.ones(4))["ess_ratio"]) == 1.0
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from test_trainer import make_batch

    tok = build_char_tokenizer()
    model = build_tiny_model("dense", vocab_size=len(tok), seed=0, num_hidden_layers=1)
    batch = make_batch(tok)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    mass = adv.abs() * batch.mask.sum(1)
    for name in ("grpo", "sat_grpo", "vcpo"):
        t = Trainer(copy.deepcopy(model), resolve_objective(name), TrainerSettings(lr=1e-3))
        out = t.step(batch, adv)
        assert 0 < out["update/ess_ratio"] < 1  # behaviour log-probs are random: unequal weights
        assert out["update/adv_pos_share"] == pytest.approx(float(mass[adv > 0].sum() / mass.sum()))
