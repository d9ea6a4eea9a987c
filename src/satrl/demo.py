"""``satrl demo``: GRPO and SAT-GRPO side by side at broadcast lag 8 on the ``local`` (asynchronous) backend,
then a short report (runs/demo/report.md with one PNG).

What ``make demo`` runs: the SAT trial's regime (``configs/grids/sat_trial.yaml``: one optimizer step per
rollout batch on the tiny MoE with a bf16 engine, lr 5e-5) for 50 steps instead of 600, seed 0, the two runs
at once (each a trainer process and its engine process, one thread each), with smaller and fewer evals: about
150 s of CPU on 2 cores (README.md gives the measurement). Long enough for what one seed can show: SAT's
gate acting and, on all 10 seeds of the trial's runs at this length, d̄_π lower under SAT-GRPO than GRPO;
the report says whether this run shows it. One seed is a preview, not evidence: the trial's verdict, with 10
seeds per cell and pre-registered tests, is docs/results/sat_trial/report.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

METHODS = ("grpo", "sat_grpo")
# The trial's regime (configs/grids/sat_trial.yaml: `extra`, `lag_schedule`) ...
TRIAL = {
    "model.name": "tiny-arith-moe", "engine.numerics": "bf16", "train.lr": 5.0e-5, "train.minibatches": 1,
    "train.ppo_epochs": 1, "train.threads": 1, "eval.at_start": True, "lag.schedule": "broadcast",
}  # fmt: skip
# ... and where the demo departs from it: the asynchronous backend (the trial ran `sequential`, which gives the
# same samples: tests/e2e/test_pipeline.py), a twelfth of the steps (at 50 steps SAT-GRPO's d̄_π is below
# GRPO's on all 10 of the trial's seeds; at 40, on 9), evals at the start and the end only, on 20 val +
# 40 test problems (the trial: every 100 steps on 80 + 100; an eval of 60 problems costs about as much CPU as 5 steps), and no
# d̄_π split (diagnostics.decompose: an extra forward per step that the report does not show). None of these
# changes what is trained: evals draw their own samples, and the split only adds metrics (tests/e2e/test_demo.py
# checks it). What the demo costs: about 1 s of CPU per step and run on an AMD EPYC, and ~9 s of imports for
# each of its 5 processes; README.md, "make demo", has the measurement.
# tests/e2e/test_demo.py checks both: TRIAL equals the grid's settings, and what LOOK_FOR says holds at 50 steps.
CHANGES = {"backend": "local", "steps": 50, "eval.every": 50, "eval.val_problems": 20, "eval.test_problems": 40,
           "diagnostics.decompose": False}  # fmt: skip
REGIME = {**TRIAL, **CHANGES}
# What one seed cannot show (update with docs/results/sat_trial/findings.md); what this run shows is computed
# from its metrics by `shown`.
LOOK_FOR = (
    "What one seed cannot show: that the gap is systematic (in the trial's runs, at this demo's 50 steps "
    "SAT-GRPO's d̄_π is below GRPO's on all 10 seeds, and at 600 steps it is 24 % lower: −0.0074 "
    "[−0.0091, −0.0058], sign-flip p 0.002 unadjusted, Holm p 0.0098 over the trial's five hypotheses), or "
    "anything about the score: one seed's score difference is noise. Over 10 seeds of 600 steps the trial found "
    "SAT-GRPO −1.3 points [−2.5, +0.3] vs GRPO at lag 8 (exact sign-flip interval: it rules out a gain larger "
    "than 0.3 points; sign-flip p 0.084 unadjusted, Holm p 0.34); see docs/results/sat_trial/findings.md."
)


def shown(d_pi: dict[str, float | None], gate_rate: float | None, sat_clipfrac: float | None, lag: float | None,
          lag_n: int) -> str:  # fmt: skip
    """What this run shows, worded from its own numbers: the realized lag, whether SAT's gate acted, and whether
    SAT-GRPO's d̄_π (last 25 % of steps) came out below GRPO's."""
    out = ["What this seed shows: the pipeline at work (the engine generates while the trainer trains"]
    out[0] += f"; realized lag {lag:.1f} on average, up to the broadcast interval {lag_n})" if lag is not None else ")"
    if gate_rate and sat_clipfrac:
        out.append(f"SAT's gate acting: it contracted the trust region on {gate_rate:.1%} of tokens (those whose "
                   f"mismatch |d| is in the top tail) and changed the gradient of {sat_clipfrac:.2%}, where SAT "
                   "differs from PPO")  # fmt: skip
    else:
        out.append("SAT's gate did not change any gradient in this run (gate rate "
                   f"{gate_rate or 0:.1%}, gradients changed {sat_clipfrac or 0:.2%}): here SAT-GRPO trained as GRPO")
    g, s = d_pi.get("grpo"), d_pi.get("sat_grpo")
    if g is None or s is None:
        out.append("d̄_π is missing for a run, so the two cannot be compared")
    elif s < g:
        out.append(f"SAT-GRPO's d̄_π over the last 25 % of steps below GRPO's ({s:.4f} vs {g:.4f}, "
                   f"{1 - s / g:.0%} lower)")  # fmt: skip
    else:
        out.append(f"SAT-GRPO's d̄_π over the last 25 % of steps not below GRPO's this time ({s:.4f} vs {g:.4f}): "
                   "one seed can land either way, which is why the trial ran 10")  # fmt: skip
    return "; ".join(out) + "."


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="directory for the two runs and report.md")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run (default {REGIME['steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lag", type=int, default=8, help="broadcast interval n")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs")


def _read(path: Path) -> list[dict]:
    from satrl.jsonl import read_jsonl

    return read_jsonl(path, null_as_nan=True)


def _mean(values: list) -> float | None:
    xs = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None


def d_pi_last25(met: list[dict]) -> float | None:
    """Mean ``mismatch/d_pi`` over the last ceil(25 %) of steps (the trial's H4 endpoint, ``d_pi_last25``)."""
    return _mean([r.get("mismatch/d_pi") for r in met[len(met) - math.ceil(len(met) / 4) :]])


def _row(name: str, path: Path, met: list[dict]) -> str:
    from satrl.experiments.mdtext import _f as _num  # "—" for a missing or non-finite number, as in reports

    s = json.loads((path / "summary.json").read_text())
    lag = s.get("lag_realized") or {}
    qs = sorted(r["obj/q"] for r in met if isinstance(r.get("obj/q"), float) and math.isfinite(r["obj/q"]))
    late = _pct(s.get("late_test_avg_at_k", s.get("late_avg_at_k")))
    best = _pct(s.get("best_test_avg_at_k", s.get("best_avg_at_k")))
    return (f"| {name} | {_num(late, '{:.1f}')} | {_num(best, '{:.1f}')} (step {s.get('best_step')}) | "
            f"{_num(lag.get('mean'), '{:.1f}')} [{_num(lag.get('min'), '{:.0f}')}-{_num(lag.get('max'), '{:.0f}')}] | "
            f"{_num(d_pi_last25(met), '{:.4f}')} | {_num(qs[len(qs) // 2] if qs else None, '{:.3f}')} | "
            f"{_num(_mean([r.get('obj/gate_rate') for r in met]), '{:.2%}')} | "
            f"{_num(_mean([r.get('obj/sat_clipfrac') for r in met]), '{:.2%}')} | "
            f"{'none' if s.get('collapse_step') is None else s['collapse_step']} | {s['wall_time_s']:.0f} |")  # fmt: skip


def _pct(x):
    """avg@k as a percentage (as in every report), None stays None."""
    return 100 * x if isinstance(x, (int, float)) else x


def _smooth(xs: list[float], w: int) -> list[float]:
    """Trailing mean over ``w`` steps: per-step d̄_π is noisy, the gap between the runs shows in its trend."""
    return [sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def write_report(out: Path, runs: dict[str, Path], lag: int = 8) -> Path:
    """report.md with one PNG: test avg@k and d̄_π over steps for each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_eval, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
    rows, top, raw, d_pi, gate, sat, lags = [], 0.0, [], {}, None, None, []
    for i, (name, path) in enumerate(runs.items()):
        ev, met = _read(path / "eval.jsonl"), _read(path / "metrics.jsonl")
        key = "test_avg_at_k" if ev and "test_avg_at_k" in ev[0] else "avg_at_k"
        ax_eval.plot([r["step"] for r in ev], [_pct(r[key]) for r in ev], marker="o", label=name)
        steps, d = [r["step"] for r in met], [r.get("mismatch/d_pi", float("nan")) for r in met]
        window = max(1, len(met) // 10)
        ax_d.plot(steps, d, color=f"C{i}", alpha=0.25, lw=0.8)
        smooth = _smooth(d, window)
        ax_d.plot(steps, smooth, color=f"C{i}", label=f"{name} ({window}-step mean)")
        top = max([top, *(x for x in smooth if math.isfinite(x))])
        raw += [x for x in d if math.isfinite(x)]
        rows.append(_row(name, path, met))
        d_pi[name] = d_pi_last25(met)
        lags.append((json.loads((path / "summary.json").read_text()).get("lag_realized") or {}).get("mean"))
        if name == "sat_grpo":
            gate, sat = _mean([r.get("obj/gate_rate") for r in met]), _mean([r.get("obj/sat_clipfrac") for r in met])
    clipped = [x for x in raw if top and x > 1.15 * top]
    if met:  # the table's d̄_π window; the y-axis ends at 1.15x the highest trailing mean (caption: what it cuts)
        start = met[len(met) - math.ceil(len(met) / 4)]["step"]
        ax_d.axvspan(start, met[-1]["step"], color="0.9", zorder=0, label="last 25 %")
        ax_d.set_ylim(0, 1.15 * top or None)
    cut = (f"the axis ends at 1.15x the highest trailing mean, which cuts off {len(clipped)} single-step "
           f"spike{'s' if len(clipped) != 1 else ''} (up to {max(clipped):.3f})" if clipped else
           "the axis ends at 1.15x the highest trailing mean; no single step lies above it")  # fmt: skip
    ax_eval.set(title="Test avg@k over training", xlabel="optimizer step", ylabel="avg@k (%)")
    ax_d.set(title="Sampled mismatch d̄_π over training", xlabel="optimizer step", ylabel="mean |log π/μ|")
    for ax in (ax_eval, ax_d):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "demo.png", dpi=110)
    plt.close(fig)
    report = out / "report.md"
    steps = met[-1]["step"] if met else 0
    lag_mean = _mean(lags)
    last = ev[-1] if ev else {}
    sizes = f"{last.get('val_n', '?')} val + {last.get('test_n', '?')} test problems, the trial's on 80 + 100"
    report.write_text(
        f"# satrl demo: SAT-GRPO vs GRPO at broadcast lag {lag}, side by side on the local backend\n\n"
        f"One seed each, {steps} steps in the SAT trial's regime (the trial ran 600; evals here on {sizes}):\n"
        "a preview of the pipeline and of the regime, not evidence. The pre-registered 10-seed trial is\n"
        "`satrl grid configs/grids/sat_trial.yaml` (docs/results/sat_trial/).\n\n"
        "| run | late test avg@k | test avg@k at the val-best step | realized lag: mean [min-max] "
        "| d̄_π (last 25%) | median q | gate rate | gradients SAT changed | collapse step (eval rule) | wall s |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n![eval and mismatch](demo.png)\n\n"
        "*avg@k in %. Left: avg@k on the test problems (mean over k samples per problem of the 0/1 reward; the best\n"
        "step is chosen on the separate val problems). Right: d̄_π (`mismatch/d_pi`), the mean |log π − log μ| over\n"
        "active tokens at each optimizer step (faint) and its trailing mean; shaded: the table's d̄_π window;\n"
        f"{cut}. Gate rate: share of tokens SAT's gate contracts (`obj/gate_rate`); gradients SAT changed:\n"
        f"`obj/sat_clipfrac`.*\n\n{shown(d_pi, gate, sat, lag_mean, lag)}\n\n{LOOK_FOR}\n"
    )
    return report


def demo_overrides(method: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The `satrl train` overrides of one demo run: the demo's regime, then the command line's."""
    from satrl.experiments.spec import render_value

    regime = {**REGIME, "lag.n": args.lag, "seed": args.seed, "objective.name": method, "out": str(out / method)}
    if args.steps:
        regime["steps"] = args.steps
    return [f"{k}={render_value(v)}" for k, v in regime.items()] + list(args.overrides)


def _forward(stream, sink) -> None:
    for line in stream:
        print(line, end="", file=sink, flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def side_by_side(cmds: dict[str, list[str]], env: dict[str, str]) -> dict[str, int]:
    """Run the commands at once, their output (plain progress lines: not a terminal) forwarded line by line to
    stdout; return each one's exit code. Each runs in its own session, as under ``satrl grid``: Ctrl-C or
    SIGTERM here (KeyboardInterrupt) stops each one's whole process group, its engine process included, and a
    demo killed outright takes them with it."""
    import signal

    from satrl.experiments.grid import _die_with_parent, _signal_group

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent)
             for name, cmd in cmds.items()}  # fmt: skip
    pumps = [threading.Thread(target=_forward, args=(p.stdout, sys.stdout), daemon=True) for p in procs.values()]
    for t in pumps:
        t.start()
    try:
        codes = {name: p.wait() for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
    for t in pumps:
        t.join()
    return codes


def run_demo(args: argparse.Namespace) -> int:
    from satrl.config import ConfigError, load_config

    out = Path(args.out)
    cmds = {}
    for method in METHODS:
        overrides, run = demo_overrides(method, out, args), out / method
        try:
            load_config(None, overrides)  # bad input: one line and exit 2, before anything starts
        except ConfigError as err:
            print(f"satrl demo: {str(err).strip().splitlines()[0]}", file=sys.stderr)
            return 2
        if (run / "summary.json").exists():  # finished earlier: only the report is redone
            continue
        resume = ["--resume", str(run)] if (run / "checkpoints" / "latest").exists() else []
        if not resume and (run / "metrics.jsonl").exists():
            (run / "metrics.jsonl").unlink()
        cmds[method] = [sys.executable, "-m", "satrl", "train", *overrides, *resume]
    # One thread per process: two runs x (trainer + engine) share the cores, and the trial's numbers are 1-thread.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.monotonic()
    try:
        codes = side_by_side(cmds, env)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (see side_by_side): the runs stopped; checkpoints stay
        print(f"satrl demo: interrupted; run the same command again to resume ({out})", file=sys.stderr)
        return 130
    failed = {m: rc for m, rc in codes.items() if rc != 0}
    if failed:
        print(f"satrl demo: {', '.join(f'{m} exited {rc}' for m, rc in failed.items())}", file=sys.stderr)
        return 2 if 2 in failed.values() else 1
    report = write_report(out, {m: out / m for m in METHODS}, args.lag)
    trained = " and ".join(cmds) + " side by side" if len(cmds) > 1 else " ".join(cmds) or "nothing (both finished)"
    print(f"demo: trained {trained} in {time.monotonic() - t0:.0f} s; report: {report}")
    return 0
