"""The data-parallel trainer (FSDP2, 2 processes on CPU with gloo) takes the same step as one device: the same
microbatches, each microbatch's SAT quantile q and every metric bit for bit, the weights after the step to
rounding (only the order of the gradient sum across ranks differs). Cases: an even number of microbatches,
an odd one (rank 1 runs a zero-weight padding microbatch), and one microbatch (rank 1 runs only padding). And no
host sync inside the step's microbatch loop."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import REPO

TORCHRUN = Path(sys.executable).with_name("torchrun")
WORKER = Path(__file__).with_name("dp_step_worker.py")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "steps.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(WORKER), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def steps(worker):
    """Rank 1 starts from the architecture on the meta device, as under `satrl train`: all it trains with
    comes from rank 0, so equality with one device also checks that its shards and buffers were filled."""
    return worker["cases"]


def test_ranks_with_different_architectures_are_refused_not_hung(worker):
    assert "the ranks' policies differ" in worker["refused"] and "\n" not in worker["refused"]


def test_cases_cover_padding(steps):
    assert [c["microbatches"] for c in steps] == [4, 3, 1]


def test_each_microbatch_equals_one_device(steps):
    for case in steps:
        dp_mbs, one_mbs = case["per_mb"]
        assert len(dp_mbs) == case["microbatches"]
        assert [m["q"] for m in dp_mbs] == [m["q"] for m in one_mbs]  # SAT's quantile, bit for bit
        assert dp_mbs == one_mbs  # every metric of every microbatch


def test_step_metrics_equal_and_weights_close(steps):
    for case in steps:
        dp_row, one_row = case["metrics"]
        assert set(dp_row) == set(one_row)
        assert {k: v for k, v in dp_row.items() if k != "obj/grad_norm"} == {
            k: v for k, v in one_row.items() if k != "obj/grad_norm"
        }
        assert dp_row["obj/grad_norm"] == pytest.approx(one_row["obj/grad_norm"], rel=1e-5)
        assert case["keys_equal"] and case["max_weight_diff"] < 1e-5


def test_a_scaled_step_uses_the_same_lr_on_every_rank(worker):
    """VCPO's ESS rule and train.lr_lag_scaling under data parallel: the same scale as one device (from the gathered
    tokens), applied by every rank to its shards (the full weights equal one device's), and the base lr kept."""
    case = worker["scaled"]
    dp_row, one_row = case["metrics"]
    scale = dp_row["train/lr_scale"]
    assert scale == one_row["train/lr_scale"] and dp_row["obj/step_scale"] == one_row["obj/step_scale"]
    assert scale == pytest.approx(dp_row["obj/step_scale"] / 2) and scale < 0.45  # lag 4: 1/sqrt(4)
    assert case["lr_after"] == 1e-2
    assert case["max_weight_diff"] < 1e-5 < 1e-3 < case["moved"]  # a rank at another lr would differ by ~1e-3


def test_microbatch_loop_has_no_host_sync(steps):
    """As on one device (test_trainer_no_host_sync.py), with FSDP's gathers and reductions in the loop."""
    assert [c["loop_syncs"] for c in steps] == [[], [], []]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_vcpo_baseline_equals_one_device(worker, kind):
    """VCPO's OPOB under data parallel (issue 45): the per-row log w and score norms from each rank's own
    microbatches, summed across ranks, and the advantages made from them equal one device's bit for bit."""
    case = worker["scores"][kind]
    assert case["microbatches"] == 3 and case["equal"] == [True, True, True]
    assert case["stats"][0] == case["stats"][1] and case["shift"] > 0  # the baseline moved: the check has teeth
    equal, diff, nonzero = case["otb"]  # train.advantage=otb: per-token pi_old and sum pi^2 from each rank's rows
    assert equal and nonzero, diff


def test_unsupported_settings_are_refused_in_one_line():
    from satrl.config import ConfigError, load_config
    from satrl.launch.data_parallel import check_supported

    check_supported(load_config(None, []))  # the defaults run
    check_supported(load_config(None, ["objective.name=vcpo"]))  # VCPO's baseline too (issue 45)
    for overrides, key in ((["r3=true", "model.name=tiny-arith-moe"], "r3"), (["train.device=mps"], "train.device")):
        with pytest.raises(ConfigError, match=key):
            check_supported(load_config(None, overrides))


def test_a_failure_while_the_trainer_is_built_ends_the_job(monkeypatch, tmp_path):
    """Every rank builds its trainer inside collectives; if rank 0 fails there it must exit (torchrun stops the
    rest), never broadcast the others a refusal they would take for the build's next collective: that deadlocked
    every torchrun job once (a transformers upgrade made rank 0 fail while placing the policy; the watchdog sees live
    heartbeats and never fires). Only once the trainers are built do the others wait for the plan, and only there
    does a refusal release them (`orchestrator.train` calls `Leader.release`)."""
    from types import SimpleNamespace

    import torch

    from satrl.config import load_config
    from satrl.launch import data_parallel as ranks
    from satrl.loop import orchestrator
    from satrl.training import dp
    from satrl.training.sharded import Sharded

    sent = []
    ctx = SimpleNamespace(leader=True, device=torch.device("cpu"))
    monkeypatch.setattr(dp, "broadcast_ints", lambda _, values, n: sent.append(values) or values)

    def fail(self, model, uses_ref, device, dtype):
        raise RuntimeError("rank 0 failed while placing the policy")

    monkeypatch.setattr(Sharded, "place", fail)
    threads = torch.get_num_threads()
    try:  # rank 0's loop, as under torchrun, up to its trainer
        with pytest.raises(RuntimeError, match="placing"):
            orchestrator.train(load_config(None, ["train.threads=1", f"out={tmp_path / 'run'}"]), ctx=ctx)
    finally:
        torch.set_num_threads(threads)
    assert sent == []  # the others are in the build's collectives: this process exits, torchrun ends them
    leader = ranks.following(ctx)
    leader.built()  # rank 0's trainer is built: the others wait for its plan
    leader.release()
    assert sent == [[ranks.REFUSED, 0, 0]]
