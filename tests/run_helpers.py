"""Shared settings for tiny end-to-end runs: a few steps of the real pipeline on the shipped base policies."""

import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# 4 prompts x 4 samples, 2 optimizer steps per batch, a tiny eval: seconds per run on 2 cores.
TINY = [
    "train.prompts_per_batch=4",
    "train.group_size=4",
    "train.minibatches=2",
    "train.threads=1",
    "engine.max_new_tokens=5",
    "eval.val_problems=2",  # the first 4 eval problems of the built-in task: 2 test, then 2 val
    "eval.test_problems=2",
    "eval.k=2",
    "eval.every=0",
    "checkpoint.every=1",
    "backend=sequential",
]

# The data-parallel reference run (`torchrun --nproc_per_node=2`) several files compare against, trained once per
# test session (conftest's ``shared_dp``): 3 batches of 2 steps at broadcast lag 2, several microbatches per step,
# evaluation at steps 0, 3 and 6, the decomposition's forwards under snapshot weights (on by default) too.
DP_CONFIG = REPO / "configs" / "sat_grpo.yaml"
DP_ARGS = [*TINY, "steps=6", "lag.n=2", "seed=5", "eval.every=3", "train.microbatch_tokens=40"]
# The same under the local backend, rank 0's engine process fed over `dist` (the split off, so the store keeps
# engine-dtype copies), versions switched in flight every 2 tokens.
DP_DIST_ARGS = [*DP_ARGS, "backend=local", "weights.transport=dist", "diagnostics.decompose=false",
                "lag.inflight_every=2"]  # fmt: skip


def torchrun(*args: str, out: Path | None = None, nproc: int = 2) -> list[str]:
    """The command of ``torchrun --standalone --nproc_per_node=<nproc> -m satrl train *args [out=<out>]``."""
    import sys

    tail = [f"out={out}"] if out is not None else []
    return [str(Path(sys.executable).with_name("torchrun")), "--standalone", f"--nproc_per_node={nproc}", "-m",
            "satrl", "train", *map(str, args), *tail, "--no-progress"]  # fmt: skip


def dp_env(**extra: str) -> dict[str, str]:
    """The environment of a torchrun job: this checkout's src/ first, one thread per rank."""
    import os

    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", **extra}


class Extra:
    """The imports of an optional extra (verl, TRL), one guard for every test file that needs one::

        with Extra("verl") as verl_extra:
            from verl.trainer.ppo import core_algos
        VERL_MISSING = verl_extra.missing   # None where it imported; else the skip reason

    An ImportError inside the block is kept as the reason (what failed, and how to install the extra) instead of
    raised, so the file still collects and its tests skip with that reason (or fail under SATRL_REQUIRE_VERL=1 /
    SATRL_REQUIRE_TRL=1, where each file's first test asserts the extra is there)."""

    HINTS = {"verl": "install the extra, see docs/integrations.md", "TRL": "install the extra: pip install '.[trl]'"}

    def __init__(self, name: str) -> None:
        self.name, self.missing = name, None

    def __enter__(self) -> "Extra":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and issubclass(kind, ImportError):
            self.missing = f"{self.name} is not importable ({exc}); {self.HINTS[self.name]}"
            return True
        return False


VOLATILE = ("wall_s", "perf/")  # timings differ between runs; everything else must not


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


# Data parallel vs one process (and a DP run resumed on another world size): what differs is only the order in
# which fp32 gradients are summed (FSDP2's reduce-scatter adds each rank's partial sum; one process adds
# microbatch by microbatch), so step 1 is bit-identical but for obj/grad_norm, and the weights after it differ by
# rounding (relative ~n * 2**-24 per gradient element). Every later log-prob then carries an absolute error
# delta ~ 1e-7, and a metric built from token log-ratios d = log pi - log mu (|d| down to ~1e-3 at these lags:
# q, c_min, the d quantiles, the TV share) carries a relative error ~ delta / |d| ~ 1e-4, compounding over steps.
# Measured over 6 steps (`python -m benchmarks.dp_drift`, docs/benchmarks.md): at most 5e-5 relative outside the engine's mismatch on
# an AMD EPYC (AVX2 and ATEN_CPU_CAPABILITY=default alike), ~1e-6 on an Intel Xeon (AVX-512). DP_RTOL leaves
# 20x that. The engine's bf16 rounding amplifies the weight difference much more in the implementation mismatch
# of batches generated after an update (mismatch/d_impl, frac_impl: 3e-4 measured): DP_IMPL_RTOL. A real
# fault (a microbatch dropped, counted twice or mis-weighted) moves step 1 by far more and fails its exact check.
DP_RTOL, DP_IMPL_RTOL = 1e-3, 5e-3

# Metrics fixed by the samples alone (which tokens, their rewards, their lags), not by any log-prob.
SAMPLE_KEYS = ("step", "skipped", "train/", "lag/", "async/", "reward/")


def same_samples_diff(a: list[dict], b: list[dict], rtol: float = 1e-3, atol: float = 1e-6) -> list[str]:
    """Where two metric logs depart from "the same samples, log-probs equal up to rounding": sample-determined
    keys must be equal, every other float within rtol / atol, the key sets the same.

    Runs that generate the same requests in differently shaped batches (Ray's shards vs one batch) get the same
    samples, but on CPUs whose matmul kernels block by batch shape (seen: an Intel Xeon with AVX-512; not an AMD
    EPYC) their log-probs differ in the last bits, and so does every metric computed from them."""
    if len(a) != len(b):
        return [f"{len(a)} rows vs {len(b)}"]
    out = []
    for x, y in zip(stable(a), stable(b)):
        if set(x) != set(y):
            out.append(f"step {x.get('step')}: keys differ: {sorted(set(x) ^ set(y))}")
            continue
        out += [f"step {x.get('step')} {k}: {v} vs {w}" for k, (v, w) in row_diff(x, y, rtol, atol, SAMPLE_KEYS).items()]
    return out


def row_diff(x: dict, y: dict, rtol: float, atol: float, exact: tuple[str, ...] = ()) -> dict:
    """``{key: (x[key], y[key])}`` for each key of ``x`` that ``y`` lacks ("gone") or holds differently: floats
    beyond rtol / atol, everything else (and keys starting with ``exact``) unequal."""
    far = {}
    for k, v in x.items():
        w = y.get(k, "gone")
        close = isinstance(v, float) and isinstance(w, float) and not k.startswith(exact)
        if (not math.isclose(v, w, rel_tol=rtol, abs_tol=atol)) if close else v != w:
            far[k] = (v, w)
    return far




def rounding_atol(metrics: dict, key: str) -> float:
    """The absolute rounding that summing in another order (microbatch order, a compiled kernel) may leave in the
    metric ``key``. ``logratio_var`` is E[x^2] - E[x]^2: its fp32 sums round at the scale of E[x^2] = var + mean^2,
    not of the variance left after the cancellation (an AVX-512 AMD EPYC, 2026-12-04: var 0.1184, mean 3.42, two
    microbatch orders 1.9e-6 apart, 1.6e-5 of the variance and 1.6e-7 of E[x^2]); 1e-7 for every other metric."""
    mean = {"obj/logratio_var": "obj/ppo_kl", "mismatch/logratio_var": "mismatch/d_mean"}.get(key)
    return 1e-6 * (metrics[key] + metrics[mean] ** 2) if mean else 1e-7


def collated_routing(completions, pad_id: int = 0):
    """The trainer-row routing [B, L, layers, k] of engine completions, placed exactly as the pipeline places
    it (``pipeline.buffer.collate``: response token t at input position prompt_len - 1 + t, -1 elsewhere)."""
    from satrl.pipeline.buffer import collate
    from satrl.types import Sample

    samples = [
        Sample(id=c.request_id, group_id=c.request_id, prompt_ids=c.prompt_ids, response_ids=c.response_ids,
               behavior_logp=c.behavior_logp, version=c.version, reward=0.0, routing=c.routing)
        for c in completions
    ]  # fmt: skip
    return collate(samples, pad_id).routing


def engine_signaller(made: list, sig: int | tuple[int, ...], times: int):
    """An ``on_step`` hook that sends ``sig`` to the current engine process ``times`` times, about three steps
    apart, each to a process not signalled before (the parent notices a dead or hung engine only when it next
    needs a batch, which can be a step or two later on a loaded machine), and the list of pids it signalled.
    ``sig``: one signal, or one per time (a run that suffers a death and a hang). ``made``: the backends the run
    made (the first is the run's)."""
    import os

    hit: list[int] = []
    sigs = sig if isinstance(sig, tuple) else (sig,) * times
    assert len(sigs) == times, (sigs, times)

    def on_step(step, metrics, result):
        pid = made[0].proc.pid
        if len(hit) < times and step >= 1 + 3 * len(hit) and pid not in hit:
            os.kill(pid, sigs[len(hit)])
            hit.append(pid)

    return on_step, hit


def fault_first_engine(monkeypatch, point: str, sig: str) -> None:
    """The next local-backend engine process started sends itself ``sig`` at its fault point ``point`` (``NAME:N``,
    ``SATRL_FAULT``: satrl.faults); the ones started after it (its replacements) run clean (``SIG,none``). A fault at
    a point the engine reaches only inside a rollout the run needs (``worker.rollout:2``, ``engine.load_weights:2``)
    is always noticed, where a signal from the trainer's step hook (``engine_signaller``) can come after a quick
    engine made every batch left."""
    monkeypatch.setenv("SATRL_FAULT", point)
    monkeypatch.setenv("SATRL_FAULT_SIGNAL", f"{sig},none")


def folder_tree(out: Path) -> dict[str, str]:
    """sha256 of every file under a run folder (the lock file holds the pid of its last holder: left out)."""
    import hashlib

    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".satrl.lock"}  # fmt: skip


def resume_lines(out: Path, *overrides: str) -> tuple[int, list[str]]:
    """``satrl train --resume out *overrides`` in this process: its exit code and non-blank stderr lines."""
    import contextlib
    import io

    from satrl import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["train", "--resume", str(out), *overrides, "--no-progress"])
    return rc, [x for x in err.getvalue().splitlines() if x.strip()]


def refused_resume(out: Path, *overrides: str) -> str:
    """The resume must exit 2 with one stderr line and leave the folder byte-identical; returns the line."""
    before = folder_tree(out)
    rc, lines = resume_lines(out, *overrides)
    assert rc == 2 and len(lines) == 1, (rc, lines[:5])
    assert folder_tree(out) == before, "a refused resume changed the run folder"
    return lines[0]


# -- `satrl ...` in a fresh process without paying the import each time ----------------------------------------
# `python -m satrl train` spends 4-7 s of CPU on 2 cores importing torch, transformers and the pipeline before its
# first step. A test that needs a process of its own (to SIGKILL it, say) but not a fresh interpreter forks it
# from multiprocessing's forkserver instead: a process started once per test process with these modules imported
# and nothing run (no torch threads, so forking it is safe), each child the state a new `python -m satrl` reaches
# after its imports. Beyond the command's own imports, what a train run imports lazily once it starts (the
# engine, the model loader and the built-in tiny policies' Qwen3 classes, the objectives, the evaluator, the local
# backend): without them each forked run paid ~4 s CPU importing them again (a 1-step tiny run: 4.8 s CPU cold,
# 0.9 s with these preloaded). Imports only: the server still runs nothing, so it starts no torch threads.
CLI_PRELOAD = ["satrl.cli", "satrl.apps.train", "satrl.loop.orchestrator", "satrl.engines.torch_engine",
               "satrl.models.loading", "satrl.models.builtins", "transformers.models.qwen3.modeling_qwen3",
               "satrl.objectives.loss", "satrl.pipeline.engines_host.local_backends", "satrl.tasks.evaluate",
               "satrl.loop.progress"]  # fmt: skip


def _cli_child(argv: list[str], env: dict[str, str | None], err_path: str) -> None:
    import os
    import sys

    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    save_coverage = _coverage_of_this_fork()
    from satrl import cli

    try:
        rc = cli.main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        save_coverage()
    sys.exit(rc)


def _coverage_of_this_fork():
    """Under `make coverage` the forkserver measures itself (.ci/coverage.rc's patch=subprocess) and a fork would
    carry on in its data file, never saved (multiprocessing ends a forked child with os._exit): measure this
    child in a data file of its own, as coverage's patch=fork does, and return what saves it."""
    try:
        from coverage import Coverage
        from coverage.control import _after_fork_in_child
    except ImportError:
        return lambda: None
    if Coverage.current() is None:
        return lambda: None
    _after_fork_in_child()
    return Coverage.current().save


class ForkedCli:
    """``satrl *argv`` forked from the forkserver (see above), with ``env`` set in it (None: unset). What
    ``benchmarks.chaos`` uses of :class:`subprocess.Popen`: ``wait``, ``send_signal``, ``pid`` and ``stderr``
    (its bytes, read after the child has ended), and ``poll``."""

    def __init__(self, argv: list[str], env: dict[str, str | None], err_path: Path) -> None:
        import io
        import multiprocessing as mp

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(CLI_PRELOAD)  # effective when the server starts (this test process's first fork)
        self._err = err_path
        self._proc = ctx.Process(target=_cli_child, args=(argv, env, str(err_path)))
        self._proc.start()
        self.pid = self._proc.pid
        self.stderr = io.BytesIO()

    def wait(self, timeout: float | None = None) -> int:
        import io
        import subprocess

        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(["satrl"], timeout)
        self.stderr = io.BytesIO(self._err.read_bytes() if self._err.is_file() else b"")
        return self._proc.exitcode

    def poll(self) -> int | None:
        """The exit code, or None while the child runs (it does not wait)."""
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        import os

        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    @staticmethod
    def stop_server() -> None:
        """End the forkserver (it holds torch's memory until this test process ends otherwise)."""
        from multiprocessing import forkserver

        forkserver._forkserver._stop()

