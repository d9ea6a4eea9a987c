"""`weights.transport`: `dist` (the trainer and the engine process in a two-process gloo group, each version
broadcast once in the engine's dtype) gives the same samples and metrics as `inproc`, with fp32, bf16-weights
and bf16 engines; a killed engine process re-joins and is fed again; what the snapshot store keeps; the refusals."""

import pytest
import torch

from run_helpers import TINY, fault_first_engine, read_jsonl, stable
from satrl.config import ConfigError, load_config
from satrl.loop import orchestrator
from satrl.weights.snapshot import Snapshot

ARGS = ["steps=6", "lag.schedule=broadcast", "lag.n=3", "seed=2", "backend=local"]


def _run(tmp_path, name: str, *overrides: str, on_step=None, resume: bool = False) -> tuple[list[dict], list[str]]:
    """The run's stable metrics and the ids of the samples it trained on, in order (``resume``: extend the run
    in ``tmp_path / name`` with ``overrides``; its ids are this extension's, its metrics the whole log's)."""
    from satrl.rundir.files import RunDir
    from satrl.training.trainer import Trainer

    ids: list[str] = []
    original = Trainer.step

    def spy(self, mb, *args, **kwargs):
        ids.extend(mb.sample_ids)
        return original(self, mb, *args, **kwargs)

    Trainer.step = spy
    try:
        if resume:
            cfg = RunDir.config_of(str(tmp_path / name), list(overrides))
        else:
            cfg = load_config(None, [*TINY, *ARGS, *overrides, f"out={tmp_path / name}"])
        orchestrator.train(cfg, on_step=on_step, resume=resume)
    finally:
        Trainer.step = original
    return stable(read_jsonl(tmp_path / name / "metrics.jsonl")), ids


def test_dist_equals_inproc(tmp_path):
    """fp32 engine: fp32 buckets. The Δπ/Δimpl split is on (the default), so the snapshot store keeps today's fp32
    copies. bf16-weights (the default numerics: bf16 buckets, which the engine rounds to anyway) is checked by
    test_killed_and_stopped_engines_rejoin_and_resume_from_engine_dtype_snapshots, whose dist run on 1 MB buckets equals inproc.
    The inproc run is the sequential backend's, which needs no engine process: the local backend's inproc run
    equals it bit for bit (tests/faults/test_engine_hang.py, tests/e2e/test_pipeline.py)."""
    inproc = _run(tmp_path, "inproc", "engine.numerics=fp32", "backend=sequential")
    dist = _run(tmp_path, "dist", "engine.numerics=fp32", "weights.transport=dist", "weights.bucket_mb=1")
    assert dist[1] == inproc[1] and len(dist[1]) > 0  # the same samples, in the same order
    assert dist[0] == inproc[0]  # every metric, bit for bit


def test_dist_with_a_bf16_moe_engine_and_engine_dtype_snapshots(tmp_path):
    """A bf16 engine on the MoE policy, the split off: the snapshot store keeps bf16 copies built from the
    trainer's bucket stream, and the run still equals inproc (which keeps fp32 copies; the sequential backend's, as
    in test_dist_equals_inproc)."""
    common = ("engine.numerics=bf16", "model.name=tiny-arith-moe", "diagnostics.decompose=false")
    inproc = _run(tmp_path, "inproc", *common, "backend=sequential")
    dist = _run(tmp_path, "dist", *common, "weights.transport=dist")
    assert dist == inproc
    from satrl.rundir.files import RunState
    from satrl.training.checkpoint import load_checkpoint
    from satrl.types import Sample

    last = sorted((tmp_path / "dist" / "checkpoints").glob("step-*"))[-1]
    _, state = load_checkpoint(last, {"RunState": RunState, "Sample": Sample})
    kept = [t for s in state["snapshots"].values() for t in s.values() if t.is_floating_point()]
    assert kept and all(t.dtype == torch.bfloat16 for t in kept)  # one bf16 copy per kept version, no fp32 one


def test_killed_and_stopped_engines_rejoin_and_resume_from_engine_dtype_snapshots(tmp_path, monkeypatch, capsys):
    """A dist run on the default numerics (bf16 buckets of 1 MB) without the Δπ/Δimpl split, so its snapshot store
    keeps bf16 copies built from the bucket stream. Its engine process is SIGKILLed at its 2nd rollout, in the first
    4 steps (2 batches); the run is then extended to 8 steps from its last checkpoint (the kept versions' bf16
    copies pushed again), and the extension's engine SIGSTOPped at its 2nd rollout: the stopped one neither rolls
    out nor receives; past engine.timeout_s (a rollout's deadline, or a broadcast's send timeout) it is killed, and each
    new process joins its own group and gets the held versions. The whole equals the uninterrupted run: samples and
    every metric. The reference is the sequential backend's (the local backend's inproc run equals it bit for bit:
    tests/faults/test_engine_hang.py), which needs no engine process. Each fault is inside a rollout the run needs,
    so it is always noticed (run_helpers.fault_first_engine)."""
    off = ("diagnostics.decompose=false",)
    reference = _run(tmp_path, "ref", *off, "steps=8", "backend=sequential")
    made = []
    make = orchestrator.make_backend
    monkeypatch.setattr(orchestrator, "make_backend", lambda *a, **k: made.append(make(*a, **k)) or made[-1])
    capsys.readouterr()
    fault_first_engine(monkeypatch, "worker.rollout:2", "SIGKILL")
    # engine.start_timeout_s: a start at load 30 on 2 cores took over 30 s
    first = _run(tmp_path, "hit", *off, "steps=4", "weights.transport=dist", "weights.bucket_mb=1",
                 "engine.timeout_s=3", "engine.start_timeout_s=60")  # fmt: skip
    assert made[0].restarts >= 1
    first_half = made[0].proc.pid  # the replacement that finished the first half
    capsys.readouterr()
    made.clear()
    fault_first_engine(monkeypatch, "worker.rollout:2", "SIGSTOP")
    rest = _run(tmp_path, "hit", "steps=8", resume=True)
    assert made[0].restarts >= 1 and made[0].proc.pid != first_half
    assert "satrl: engine process hung: no rollout in 3 s, engine.timeout_s; restarted it" in capsys.readouterr().err
    assert rest[0] == reference[0] and first[1] + rest[1] == reference[1] and len(rest[1]) > 0


def test_snapshot_source_keeps_an_engine_dtype_copy_unless_the_split_needs_fp32():
    from satrl.launch.setup import snapshot_cut
    from satrl.models import load_policy
    from satrl.objectives import resolve_objective
    from satrl.training.settings import TrainerSettings
    from satrl.training.trainer import Trainer

    model, _ = load_policy("tiny-arith")
    trainer = Trainer(model, resolve_objective("grpo"), TrainerSettings(lr=1e-4))

    def source(transport: str, decompose: bool, bucket_mb: int = 1):
        cfg = load_config(None, [f"weights.transport={transport}", f"diagnostics.decompose={str(decompose).lower()}",
                                 f"weights.bucket_mb={bucket_mb}", "engine.numerics=bf16-weights"])  # fmt: skip
        trainer.export.snapshot_cut = snapshot_cut(cfg)  # what TrainerSettings.snapshot_cut carries in a run
        return trainer.export.snapshot

    assert source("dist", decompose=True)().state() is trainer.export.weights()
    assert source("inproc", decompose=False)().state() is trainer.export.weights()
    kept = source("dist", decompose=False)()
    assert kept.full is None and len(kept.packed) > 1  # the trainer's buckets as they came (bucket_mb=1)
    copy = kept.state()
    want = trainer.model.state_dict()
    assert copy.keys() == want.keys() and kept.state() is copy  # unpacked once
    assert all(torch.equal(copy[k], v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in want.items())
    stream, tied = kept.stream(torch.bfloat16, 2**20)  # what the dist broadcast sends: those very buckets
    assert stream is kept.packed and tied == {"lm_head.weight": "model.embed_tokens.weight"}


def test_resuming_the_split_from_engine_dtype_snapshots_is_refused():
    from satrl.launch.setup import check_snapshots

    bf16 = {3: {"w": torch.zeros(2, dtype=torch.bfloat16)}}
    check_snapshots(bf16, decompose=False)
    check_snapshots({3: {"w": torch.zeros(2)}}, decompose=True)
    with pytest.raises(ConfigError, match=r"diagnostics.decompose=true: .* versions \[3\] in the engine's dtype"):
        check_snapshots(bf16, decompose=True)


@pytest.mark.parametrize("backend", ["sequential", "ray"])
def test_dist_on_another_backend_is_one_config_line(backend):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"backend={backend}", "weights.transport=dist"])
    assert str(err.value) == (f"invalid config: weights.transport=dist: only backend=local supports it "
                              f"(got backend={backend}); use weights.transport=inproc")  # fmt: skip


@pytest.mark.parametrize(("overrides", "line"), [
    (["backend=sequential", "engine=vllm"], "weights.transport=vllm: only backend=local supports it (got "
     "backend=sequential); use weights.transport=inproc"),
    (["backend=local"], "weights.transport=vllm: needs engine.name=vllm (got torch); use weights.transport=dist"),
])  # fmt: skip
def test_vllm_transport_needs_the_local_backend_and_the_vllm_engine(overrides, line):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*overrides, "weights.transport=vllm"])
    assert str(err.value) == f"invalid config: {line}"


def test_cli_exits_2_on_it(tmp_path, capsys):
    from satrl.cli import main

    code = main(["train", f"out={tmp_path / 'x'}", "backend=sequential", "weights.transport=dist"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weights.transport=dist" in err[0]


@pytest.mark.slow
def test_data_parallel_dist_equals_one_process(tmp_path, shared_dp):
    """torchrun, 2 ranks, rank 0's engine process fed over `dist` from the ranks' joint bucket stream (the split
    off, so the store keeps bf16 copies; versions switched in flight): the same samples as one process, every
    other metric within data parallel's tolerance (docs/design.md, "Data parallel"). The 2-rank run is
    run_helpers.DP_DIST_ARGS's, shared with tests/e2e/test_dp_engine_faults.py's reference. The one process runs
    the sequential backend (TINY's): no engine process to start (~4 s of CPU), and the local backend's in-flight run
    on `inproc` equals it bit for bit (tests/pipeline/test_inflight.py)."""
    from run_helpers import DP_CONFIG, DP_DIST_ARGS, DP_RTOL, row_diff, same_samples_diff, stable

    one_process = [a for a in DP_DIST_ARGS if a not in ("weights.transport=dist", "backend=local")]
    orchestrator.train(load_config(DP_CONFIG, [*one_process, f"out={tmp_path / 'one'}"]))
    dp = read_jsonl(shared_dp(DP_CONFIG, *DP_DIST_ARGS) / "metrics.jsonl")
    one = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert len(one) == 6 and same_samples_diff(one, dp, rtol=DP_RTOL, atol=1e-9) == []
    far = row_diff(stable(one)[0], stable(dp)[0], 0.0, 0.0)
    assert set(far) <= {"obj/grad_norm"}, far  # step 1: the same bits but the gradient norm's sum order


def test_an_engine_that_fails_to_start_is_an_error_not_a_hang(tmp_path):
    """Under dist the first push waits for the engine process to join: one that fails at start-up is its
    error in the parent (read from the results pipe), never a wait for the group."""
    from satrl.launch.setup import worker_spec
    from satrl.pipeline.engines_host.local_backends import ProcessBackend
    from satrl.pipeline.engines_host.worker import RolloutRequest

    spec = worker_spec(load_config(None, [*TINY, "engine.kwargs={bogus: 1}", f"out={tmp_path / 'run'}"]))
    backend = ProcessBackend(spec, timeout_s=60, start_timeout_s=120, transport="dist")
    try:
        with pytest.raises(Exception, match="engine"):
            backend.push(0, Snapshot.of_state({"w": torch.zeros(2)}))
            backend.submit(RolloutRequest(0, [0] * 4))
            backend.result(0)
    finally:
        backend.close()
