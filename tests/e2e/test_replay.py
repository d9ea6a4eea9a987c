"""Bit-identical replay of every shipped method config against tests/data/replay.json (see tests/e2e/replay.py).

A metric key that the record has must have exactly the recorded value at every step; keys added since the
record was made are allowed (new diagnostics), keys removed are not."""

import json

import pytest
from replay import CONFIGS, RECORD, replay


@pytest.mark.parametrize("config", CONFIGS)
def test_replay_is_bit_identical(tmp_path, config):
    expected = json.loads(RECORD.read_text())[config]
    got = replay(config, tmp_path / "run")
    for part in ("metrics", "eval"):
        assert len(got[part]) == len(expected[part]), part
        for step, (g, e) in enumerate(zip(got[part], expected[part]), start=1):
            missing = sorted(set(e) - set(g))
            assert not missing, f"{config} {part} row {step}: keys gone: {missing}"
            diff = {k: (e[k], g[k]) for k in e if g[k] != e[k]}
            assert not diff, f"{config} {part} row {step}: (recorded, now) = {diff}"
