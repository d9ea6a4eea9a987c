"""Settings that would break training silently are refused in one line (issue 46, item 5): a gradient clip that
zeroes or reverses the gradient, IcePop bounds that keep no token, an lr or weight decay that wrecks the weights at
step 1, a temperature or KL coefficient that skips every step, Adam betas outside [0, 1). The range edges load."""

import pytest

from satrl.config import ConfigError, load_config

BAD = [
    (["train.grad_clip=-1"], "train.grad_clip"),
    (["train.grad_clip=0"], "train.grad_clip"),
    (["objective.name=grpo_icepop", "objective.correction.icepop_low=5", "objective.correction.icepop_high=1"],
     "icepop_low 5.0 must be below icepop_high 1.0"),
    (["train.lr=1e30"], "train.lr"),
    (["train.weight_decay=1e308"], "train.weight_decay"),
    (["engine.temperature=1e-300"], "engine.temperature"),
    (["objective.kl.coef=1e308"], "coef"),
    (["train.betas=[2, 3]"], "train.betas"),
]


@pytest.mark.parametrize("overrides,named", BAD, ids=[b[1] for b in BAD])
def test_a_setting_that_breaks_training_is_one_line(overrides, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_the_range_edges_and_null_clip_load():
    cfg = load_config(None, ["train.grad_clip=null", "train.lr=1", "train.weight_decay=1", "engine.temperature=0.01",
                             "objective.kl.coef=100", "train.betas=[0, 0.999]"])  # fmt: skip
    assert cfg.train.grad_clip is None and cfg.train.lr == 1.0 and cfg.engine.temperature == 0.01
