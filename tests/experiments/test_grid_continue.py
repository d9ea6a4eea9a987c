"""A grid continued from its committed pack, as the trials' findings tell users to (`cp -r docs/results/G runs/G`,
`satrl grid ... --out runs/G`, `satrl report runs/G --pack docs/results/G`): the packed runs are skipped, only the
rest train, and packing the second session into the first pack holds every run and both sessions' history.
`pack_results` promises this (a pack "can be used as `--out` of the same grid to continue it elsewhere")."""

import json
import shutil

from test_grid import RUNNER_GRID, _write, read_log

from satrl.experiments.grid import load_grid, run_grid_spec
from satrl.experiments.status import run_status
from satrl.experiments.store import load_results, pack_results

GRID = RUNNER_GRID.replace("      bad: {fail: true}\n", "")
ALL = ["a/lag2/seed0", "a/lag2/seed1", "b/lag2/seed0", "b/lag2/seed1"]


def test_a_grid_continues_from_its_pack_on_another_machine(tmp_path, fake_trainer, capsys):
    command, log = fake_trainer
    spec = load_grid(_write(tmp_path, GRID))
    first, pack = tmp_path / "machine1" / "g", tmp_path / "docs" / "g"
    env = {"FAKE_LOG": str(log)}
    res = run_grid_spec(spec, first, workers=1, command_fn=command, progress=False, env=env, only=["a/*"])
    assert res.exit_code == 0 and sorted(res.names("finished")) == ALL[:2]
    pack_results(first, pack)
    assert not list(pack.rglob("checkpoints")) and not list(pack.rglob(".satrl*"))  # nothing to clean before a copy

    second = tmp_path / "machine2" / "g"  # a fresh checkout: the committed pack copied in as --out
    shutil.copytree(pack, second)
    assert all(run_status(second / n) == "finished" for n in ALL[:2])
    capsys.readouterr()
    res2 = run_grid_spec(spec, second, workers=1, command_fn=command, progress=False, env=env)
    # the start of its log says where it stands: the fake runs' summaries say 0.1 s each
    assert "grid g: 2 of 4 runs finished, 0.00 machine-hours spent (their wall_time_s); 2 to run, about 0.00" in (
        capsys.readouterr().err)
    assert res2.exit_code == 0, {n: r.error for n, r in res2.records.items() if r.error}
    assert sorted(res2.names("skipped")) == ALL[:2] and sorted(res2.names("finished")) == ALL[2:]
    trained = sorted(str(e["out"]).split("/g/")[1] for e in read_log(log))
    assert trained == sorted(ALL)  # each run trained once, across the two machines

    pack_results(second, pack)
    results = load_results(pack)
    assert sorted(results.finished.apply(lambda r: f"{r.cell}/lag{r.lag}/seed{r.seed}", axis=1)) == ALL
    status = json.loads((pack / "grid_status.json").read_text())
    assert status["counts"] == {"finished": 4}
    (earlier,) = status["history"]  # the first machine's session, kept; the second's is the status itself
    assert earlier["finished"] == ALL[:2] and earlier["started"] <= status["started"]
    assert all(status["runs"][n]["status"] == "finished" for n in ALL)
    text = (pack / "grid_status.json").read_text()  # the machines' --out folders are not in what is committed
    assert str(first) not in text and str(second) not in text and "runs/g/a/lag2/seed0" in text
