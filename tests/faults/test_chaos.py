"""The chaos run of benchmarks/chaos.py at test size: >= 10 seeded kill points (replay a failure with
SATRL_CHAOS_SEED=<seed>), every hostile input, an engine kill, an engine hang, every damaged checkpoint. Prints
the summary line the README quotes."""

import os

from benchmarks.chaos import (
    bad_checkpoints,
    engine_hangs,
    engine_kills,
    hostile_inputs,
    kill_anywhere,
    summary_line,
)


def test_chaos_summary(tmp_path, capsys):
    seed = int(os.environ.get("SATRL_CHAOS_SEED", "0"))
    kill = kill_anywhere(tmp_path / "kill", points=10, seed=seed)
    hostile = hostile_inputs(tmp_path / "hostile")
    engine = engine_kills(tmp_path / "engine", kills=(2,))
    hang = engine_hangs(tmp_path / "hang", stops=(1,))
    checkpoint = bad_checkpoints(tmp_path / "checkpoint")
    line = summary_line(kill, hostile, engine, hang=hang, checkpoint=checkpoint)
    with capsys.disabled():
        print(f"\n{line} (seed {seed})")
    assert kill["tried"] >= 10 and kill["identical"] == kill["tried"], line
    assert hostile["tried"] >= 45 and hostile["clean"] == hostile["tried"], line
    assert engine["lost"] == 0 and engine["duplicated"] == 0 and engine["identical"] and engine["restarts"] == 1, line
    assert hang["lost"] == 0 and hang["duplicated"] == 0 and hang["identical"] and hang["restarts"] == 1, line
    assert checkpoint["tried"] >= 9 and checkpoint["clean"] == checkpoint["tried"], line
