"""lag.inflight_every: responses move on to newer weights every K decoded tokens (issue 28, step 3).

The switch points are fixed by the schedule, so a concurrent run (local backend, the engine waiting for
versions the trainer pushes mid-rollout) equals its sequential replay, and a resumed run its uninterrupted one.
"""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from run_helpers import SAMPLE_KEYS, TINY, fault_first_engine, read_jsonl, stable
from satrl.config import ConfigError, load_config
from satrl.loop import orchestrator, rollouts
from satrl.loop.orchestrator import train
from satrl.pipeline.buffer import collate
from satrl.pipeline.schedules import inflight_version, inflight_versions
from satrl.rundir.files import RunDir
from satrl.training.trainer import Trainer
from satrl.types import Sample

K = 4
INFLIGHT = [f"lag.inflight_every={K}", "engine.max_new_tokens=9", "steps=8"]  # S = 2 (TINY): cap = 2b


def _run(tmp_path, name, *overrides, on_step=None):
    out = tmp_path / name
    train(load_config(None, [*TINY, *INFLIGHT, *overrides, f"out={out}"]), on_step=on_step)
    return out, read_jsonl(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A sequential in-flight run, with every collated batch and the rows and metrics of every step."""
    batches, steps = [], []
    collate, metrics = rollouts.collate, orchestrator._batch_metrics

    def keep_batch(samples, pad):
        batches.append(collate(samples, pad))
        return batches[-1]

    def keep_rows(batch, rows, *args):
        steps.append((len(batches) - 1, rows))
        return metrics(batch, rows, *args)

    logged = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollouts, "collate", keep_batch)  # Rollouts.take collates each batch
        mp.setattr(orchestrator, "_batch_metrics", keep_rows)
        _, rows = _run(tmp_path_factory.mktemp("inflight"), "sequential",
                       on_step=lambda v, m, r: logged.append((v, m)))  # fmt: skip
    return batches, steps, logged, rows


def test_tokens_follow_the_rule_and_responses_cross_versions(traced):
    batches, _, _, rows = traced
    multi = 0
    for b, batch in enumerate(batches):
        for i in range(batch.mask.shape[0]):
            v = batch.versions[i][batch.mask[i]].tolist()
            assert v == [inflight_version(v[0], 2 * b, K, t) for t in range(len(v))]
            multi += len(set(v)) > 1
    assert multi > 0, "no push happened mid-response"
    assert sum(r["lag/multi_version_frac"] for r in rows) > 0


def test_per_token_lag_in_metrics_matches_token_versions(traced):
    batches, steps, logged, _ = traced
    assert len(steps) == len(logged) == 8
    for (b, rows), (version, metrics) in zip(steps, logged):
        mask, versions = batches[b].mask[rows], batches[b].versions[rows]
        lag = (version - 1 - versions)[mask].double()  # trained at the version before the step
        assert metrics["lag/mean"] == pytest.approx(float(lag.mean()), abs=1e-12)
        assert (metrics["lag/min"], metrics["lag/max"]) == (float(lag.min()), float(lag.max()))
        spread = [len(set(versions[i][mask[i]].tolist())) > 1 for i in range(len(rows))]
        assert metrics["lag/multi_version_frac"] == pytest.approx(sum(spread) / len(spread))
        for k in torch.unique(lag.long()).tolist():
            assert metrics[f"bylag/{k}/frac_tokens"] == pytest.approx(float((lag == k).double().mean()))


def test_killed_concurrent_run_resumed_mid_run_equals_sequential_replay(tmp_path, traced, monkeypatch):
    """The local backend's concurrent run, resumed mid-way (finished batches saved with their versions), equals the
    sequential replay when the resumed run's engine child is SIGKILLed at its 2nd weight load: past its first
    rollout's start, so (its batch's start version is below its cap) at a switch mid-response, just before it
    may wait for a version the trainer has not pushed yet (the new one is fed the held versions again, redoes the
    batch and waits the same way). A fault inside a rollout
    the run needs is always noticed. One kill, after the resume: a kill in the first half too would start one more
    engine process (~6 s of CPU) for the same path."""
    made, original = [], orchestrator.make_backend
    monkeypatch.setattr(orchestrator, "make_backend", lambda *a, **kw: made.append(original(*a, **kw)) or made[-1])
    out, _ = _run(tmp_path, "killed", "steps=4", "backend=local")
    first = made[0].proc.pid
    made.clear()
    fault_first_engine(monkeypatch, "engine.load_weights:2", "SIGKILL")
    train(RunDir.config_of(out, ["steps=8"]), resume=True)
    assert made[0].restarts >= 1 and made[0].proc.pid != first
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(traced[3])


def test_async_hold_with_inflight_updates_replays_too(tmp_path):
    """Per-group start versions (async) held back for fresher weights (hold), then moving on in flight."""
    setting = ["lag.schedule=async", "lag.max_staleness=2", "lag.on_stale=hold", "seed=5", "steps=6"]
    _, sequential = _run(tmp_path, "sequential", *setting)
    _, local = _run(tmp_path, "local", *setting, "backend=local")
    assert stable(local) == stable(sequential)
    assert sum(r["lag/multi_version_frac"] for r in sequential) > 0
    assert all(r["async/dropped"] == 0 for r in sequential) and max(r["lag/max"] for r in sequential) <= 2


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 50), ahead=st.integers(0, 20), every=st.integers(0, 9), tokens=st.integers(1, 40))
def test_rule_is_monotone_bounded_and_one_version_per_period(start, ahead, every, tokens):
    cap = start + ahead
    v = [inflight_version(start, cap, every, t) for t in range(tokens)]
    assert v[0] == start and all(start <= x <= cap for x in v)
    assert all(0 <= b - a <= 1 for a, b in zip(v, v[1:]))
    assert all(v[t] == v[t - 1] for t in range(1, tokens) if every == 0 or t % every)
    assert inflight_versions(start, cap, every, tokens) == set(v)


def test_resume_mid_run_is_exact(tmp_path, traced):
    """Sequential; the local backend's resume is test_killed_concurrent_run_resumed_mid_run_equals_sequential_replay."""
    out, _ = _run(tmp_path, "extended", "steps=4")
    train(RunDir.config_of(out, ["steps=8"]), resume=True)
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(traced[3])


def test_a_period_past_the_response_changes_nothing(tmp_path):
    """K >= max_new_tokens never switches: the same samples (and numbers) as in-flight updates off."""
    _, off = _run(tmp_path, "off", "lag.inflight_every=0")
    _, never = _run(tmp_path, "never", "lag.inflight_every=9")
    assert stable(never) == stable(off)
    assert all(r["lag/multi_version_frac"] == 0 for r in off)
    assert {k for k in off[0] if k.startswith(SAMPLE_KEYS)} <= set(never[0])


def test_other_backends_are_refused_and_both_engines_switch():
    with pytest.raises(ConfigError, match=r"lag.inflight_every=4 needs backend local or sequential \(got ray\)"):
        load_config(None, [f"lag.inflight_every={K}", "backend=ray"])
    assert load_config(None, []).lag.inflight_every == 0
    assert load_config(None, [f"lag.inflight_every={K}", "engine.name=vllm"]).lag.inflight_every == K


def test_decomposition_scores_each_token_under_its_own_version():
    """version_logp runs one forward per version present and each token takes its own version's."""
    def sample(i, versions):
        n = len(versions)
        return Sample(f"s{i}", "g", [5], [7] * n, torch.zeros(n), versions[0], 1.0, token_versions=torch.tensor(versions))

    batch = collate([sample(0, [3, 3, 4, 5]), sample(1, [2, 2]), sample(2, [4, 4, 4])], pad_id=0)
    calls = []

    def logp_with(state, mb):  # "log-probs" that name the version they were computed under
        calls.append((state, mb.mask.shape[0]))
        return torch.full(mb.mask.shape, float(state))

    got = Trainer.version_logp(SimpleNamespace(logp_with=logp_with), batch, snapshots=lambda v: v)
    assert torch.equal(got[batch.mask], batch.versions[batch.mask].float())
    assert sorted(calls) == [(2, 1), (3, 1), (4, 2), (5, 1)]
    assert Trainer.version_logp(SimpleNamespace(logp_with=logp_with), batch, snapshots=lambda v: None) is None
