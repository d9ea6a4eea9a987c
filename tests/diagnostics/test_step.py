import math

import torch

from satrl.diagnostics import step_diagnostics

NAN = float("nan")


def test_step_diagnostics_keys_and_values():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
    behavior = torch.log(torch.tensor([[0.3, 0.2, 0.5], [0.3, 0.6, 0.9]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    lag = torch.tensor([1, 3])
    tok = {
        "tok/gate": torch.tensor([[True, False, False], [False, False, True]]),
        "tok/clipped": torch.tensor([[True, False, True], [False, False, True]]),
        "tok/d": torch.where(mask, logp - behavior, torch.full_like(logp, NAN)),
    }
    routing = torch.zeros(2, 3, 2, 2, dtype=torch.long)
    out = step_diagnostics(
        logp=logp,
        behavior_logp=behavior,
        mask=mask,
        lag=lag,
        tok=tok,
        logp_at_version=behavior,
        engine_routing=routing,
        trainer_routing=routing,
    )
    expected = {
        "mismatch/d_pi",
        "mismatch/d_mean",
        "mismatch/d_p90_abs",
        "mismatch/d_max_abs",
        "mismatch/logratio_var",
        "lag/mean",
        "lag/max",
            "lag/min",
        "gate/tv_share",
        "gate/tv_lift",
        "gate/tv_mass_mean",
        "mismatch/d_policy",
        "mismatch/d_impl",
        "mismatch/frac_policy",
        "mismatch/frac_impl",
        "moe/route_disagree",
        "moe/route_disagree/layer0",
        "moe/route_disagree/layer1",
        "moe/expert_diff",
    } | {f"bylag/{k}/{n}" for k in (1, 3) for n in ("frac_tokens", "abs_d", "clipfrac", "gate_rate")}
    assert set(out) == expected
    assert all(v.dim() == 0 and math.isfinite(v.item()) for v in out.values())
    assert math.isclose(out["lag/mean"].item(), (3 * 1 + 2 * 3) / 5)
    assert math.isclose(out["bylag/1/clipfrac"].item(), 2 / 3) and out["bylag/3/gate_rate"].item() == 0.0
    assert out["mismatch/frac_policy"].item() == 1.0  # logp_at_version == behavior: all lag
    assert out["moe/route_disagree"].item() == 0.0


def test_step_diagnostics_groups_switch_off():
    x = torch.zeros(1, 2)
    out = step_diagnostics(logp=x, behavior_logp=x, mask=torch.ones(1, 2, dtype=torch.bool))
    assert set(out) == {f"mismatch/{k}" for k in ("d_pi", "d_mean", "d_p90_abs", "d_max_abs", "logratio_var")}
