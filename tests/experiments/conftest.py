"""Shared helpers: a fake `satrl train` (a script the tests write) and synthetic run directories."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from satrl.experiments.grid import Run, default_command

FAKE_TRAINER = textwrap.dedent(
    '''
    """Stands in for `satrl train BASE k=v ... seed=S out=DIR [--resume DIR]`."""
    import json, os, sys, time
    from pathlib import Path

    argv = sys.argv[1:]
    resume = None
    if "--resume" in argv:
        i = argv.index("--resume")
        resume = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    assert argv[-1] == "--no-progress", argv
    base, kv = argv[0], dict(a.split("=", 1) for a in argv[1:-1])
    out, seed = Path(kv["out"]), int(kv["seed"])
    t0 = time.time()
    print(f"fake trainer: base={base} seed={seed}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pid").write_text(str(os.getpid()))
    time.sleep(float(kv.get("sleep", "0")))
    if kv.get("fail") == "true":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("ValueError: boom: this cell is configured to fail", file=sys.stderr)
        sys.exit(3)
    steps, lag, sat = int(kv.get("steps", "8")), int(kv["lag.n"]), kv.get("sat") == "true"
    offset = float(kv.get("offset", "0.3"))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            row = {"step": s, "mismatch/d_pi": 0.01 + 0.001 * seed + 0.0001 * s, "obj/clipfrac": 0.05 * lag / 8,
                   f"bylag/{1 + s % max(lag, 1)}/clipfrac": 0.01 * (1 + s % max(lag, 1))}
            if sat:
                row.update({"obj/gate_rate": 0.1, "obj/q": 0.02, "obj/eps_low_mean": 0.15,
                            "obj/eps_high_mean": 0.2, "gate/tv_share": 0.4 + 0.01 * seed,
                            f"bylag/{1 + s % max(lag, 1)}/gate_rate": 0.05 * (1 + s % max(lag, 1))})
            f.write(json.dumps(row) + "\\n")
    best = offset + 0.02 * seed - 0.01 * lag
    with open(out / "eval.jsonl", "w") as f:
        for s in range(0, steps + 1, 4):
            f.write(json.dumps({"step": s, "avg_at_k": best * s / steps, "greedy_acc": best, "k": 8}) + "\\n")
    (out / "config.yaml").write_text(f"seed: {seed}\\n")
    # today's summary of a run without a val/test split: the late window (the last 25 % of steps) holds only
    # the last eval, whose score is `best`; the scores rise, so the eval rule sees no collapse ("collapse"
    # sets the training-reward rule's)
    summary = {"best_avg_at_k": best, "best_step": steps, "final_avg_at_k": best - 0.05, "late_avg_at_k": best,
               "collapse_step": None, "summary_version": 2,
               "reward_collapse_step": 6 if (kv.get("collapse") == "true" and seed % 2) else None,
               "d_pi_last25": 0.01 + 0.001 * seed, "gate_rate_mean": 0.1 if sat else None,
               "wall_time_s": 0.1, "steps": steps, "status": "finished"}
    (out / "summary.json").write_text(json.dumps(summary))
    log = os.environ.get("FAKE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"out": str(out), "start": t0, "end": time.time(), "resume": resume,
                                "pid": os.getpid(), "threads": kv.get("train.max_threads"),
                                "base": base}) + "\\n")
    '''
)


def _fake_trainer(folder: Path):
    """(command_fn, log_path): command_fn(run, resume) runs the fake trainer (written into ``folder``) with
    satrl's argv layout."""
    script = folder / "fake_train.py"
    script.write_text(FAKE_TRAINER)
    log = folder / "fake_log.jsonl"

    def command(run: Run, resume: bool) -> list[str]:
        cmd = default_command(run, resume)
        assert cmd[1:4] == ["-m", "satrl", "train"]
        return [sys.executable, str(script), *cmd[4:]]

    return command, log


@pytest.fixture
def fake_trainer(tmp_path: Path):
    """(command_fn, log_path): command_fn(run, resume) runs the fake trainer with satrl's argv layout."""
    return _fake_trainer(tmp_path)


@pytest.fixture(scope="module")
def module_fake_trainer(tmp_path_factory):
    """:func:`fake_trainer` for a module-scoped fixture (a grid that a module's tests only read)."""
    return _fake_trainer(tmp_path_factory.mktemp("fake_trainer"))


@pytest.fixture
def no_pngs(monkeypatch):
    """For a test that checks a report's text, not its figures: each figure is computed and its section written,
    but not drawn into a PNG (test_report_table_matches_summaries and the figure tests check the drawing)."""
    from satrl.experiments import plots

    monkeypatch.setattr(plots, "_save", lambda fig, path, title=None: plots.plt.close(fig))


@pytest.fixture
def make_run():
    return _make_run


def _make_run(out: Path, cell: str, lag: int, seed: int, summary: dict | None, metrics=(), evals=(),
              config: str = "") -> Path:
    """A synthetic run directory as `satrl train` writes it (``config``: YAML lines added to its config.yaml)."""
    d = out / cell / f"lag{lag}" / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    if summary is not None:
        (d / "summary.json").write_text(json.dumps({"status": "finished", **summary}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (d / "config.yaml").write_text(f"seed: {seed}\n{config}")
    return d
