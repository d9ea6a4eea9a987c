"""``satrl demo``: GRPO, SAT-GRPO and VCPO side by side at broadcast lag 8 on the ``local`` (asynchronous)
backend, then a short report (runs/demo/report.md with one PNG).

What ``make demo`` runs: the SAT trial's regime (``configs/grids/sat_trial.yaml``: one optimizer step per
rollout batch on the tiny MoE with a bf16 engine, lr 5e-5; the repair trial's, where VCPO was confirmed, is the
same) for 50 steps instead of 600, seed 0, the three runs at once (each a trainer process and its engine process,
one thread each), with smaller and fewer evals (docs/benchmarks.md, "Demo", gives its cost). Long enough for what
one seed can show: what each method does to the update (SAT's gate; VCPO's effective sample size, step scale and
baseline shift) and, on all 10 seeds of the SAT trial's runs at this length, d̄_π lower under SAT-GRPO than GRPO;
the report says whether this run shows it. One seed is a preview, not evidence: the trials' verdicts, with 10
seeds per cell and pre-registered tests, are docs/results/sat_trial/ and docs/results/repair_trial/.
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

METHODS = ("grpo", "sat_grpo", "vcpo")
# The trial's regime (configs/grids/sat_trial.yaml: `extra`, `lag_schedule`) ...
TRIAL = {
    "model.name": "tiny-arith-moe", "engine.numerics": "bf16", "train.lr": 5.0e-5, "train.minibatches": 1,
    "train.ppo_epochs": 1, "train.threads": 1, "eval.at_start": True, "lag.schedule": "broadcast",
}  # fmt: skip
# ... and where the demo departs from it: the asynchronous backend (the trial ran `sequential`, which gives the
# same samples: tests/e2e/test_pipeline.py), a twelfth of the steps (at 50 steps SAT-GRPO's d̄_π is below
# GRPO's on all 10 of the trial's seeds; at 40, on 9), evals at the start and the end only, on 20 val +
# 40 test problems (the trial: every 100 steps on 80 + 100; an eval of 60 problems costs about as much CPU as 5
# steps), and no d̄_π split (diagnostics.decompose: an extra forward per step that the report does not show). None of these
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
    "than 0.3 points; sign-flip p 0.084 unadjusted, Holm p 0.34); see docs/results/sat_trial/findings.md. "
    "VCPO, at lag 32 over 600 steps, scored +4.2 points [+3.0, +5.4] of late avg@8 above GRPO on the repair "
    "trial's 10 fresh seeds (docs/results/repair_trial/findings.md) and +3.2 [+1.7, +4.7] on the VCPO factorial's "
    "10 (docs/results/vcpo_factorial/findings.md). The factorial found that its baseline (OPOB) carries that gain: "
    "OPOB alone, ESS step off, +3.5 [+2.6, +4.3] over GRPO at lag 32 on 16 fresh seeds, and +2.0 [+1.0, +3.0] "
    "without staleness, while the ESS step adds nothing detectable. The baselines trial, on 29 fresh seeds "
    "(docs/results/baselines_trial/findings.md), found a constant offset below the group mean equivalent to OPOB "
    "within a point at lag 32 (+0.0 [−0.5, +0.5]) at GRPO's run time, and OPOB's gain larger with staleness than "
    "without (+1.17 [+0.56, +1.79]); whether because the rollouts are stale or the policy weaker, it cannot say."
)


def shown(d_pi: dict[str, float | None], gate_rate: float | None, sat_clipfrac: float | None, lag: float | None,
          lag_n: int, vcpo: dict[str, float | None] | None = None) -> str:  # fmt: skip
    """What this run shows, worded from its own numbers: the realized lag, whether SAT's gate acted, whether
    SAT-GRPO's d̄_π (last 25 % of steps) came out below GRPO's, and what VCPO's two controls did (``vcpo``: the
    run means of :data:`VCPO_METRICS`, absent when no VCPO run)."""
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
    if vcpo is not None:
        out.append(_vcpo_shown(vcpo))
    return "; ".join(out) + "."


# VCPO's metrics the report reads (docs/metrics.md): ESS / B of the batch's importance weights, the step scale
# sqrt(min(1, ESS/B)) the lr is multiplied by, and |b_g - mean_g R|, how far the baseline moved from GRPO's.
VCPO_METRICS = ("obj/ess_ratio", "obj/step_scale", "obj/opob_shift")


def _vcpo_shown(v: dict[str, float | None]) -> str:
    ratio, scale, shift = (v.get(k) for k in VCPO_METRICS)
    if ratio is None or scale is None or shift is None:
        return "VCPO's metrics are missing, so what its controls did cannot be said"
    step = (f"VCPO's step size: the batches' importance weights kept an effective sample size of {ratio:.1%} of "
            f"the batch on average, so its lr ran at {scale:.3f}x on average "
            f"(down to {v.get('min_step_scale', scale):.3f}x)")
    base = (f"VCPO's baseline: {shift:.2f} reward units on average away from GRPO's group mean (weighted by the "
            "responses' gradient norms and importance weights)")
    return step + "; " + base


def add_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="directory for the runs and report.md")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run (default {REGIME['steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lag", type=int, default=8, help="broadcast interval n")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")


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
    """The scores table's row: what every method is judged on."""
    from satrl.experiments.mdtext import _f as _num  # "—" for a missing or non-finite number, as in reports

    s = json.loads((path / "summary.json").read_text())
    lag = s.get("lag_realized") or {}
    late = _pct(s.get("late_test_avg_at_k", s.get("late_avg_at_k")))
    best = _pct(s.get("best_test_avg_at_k", s.get("best_avg_at_k")))
    return (f"| {name} | {_num(late, '{:.1f}')} | {_num(best, '{:.1f}')} (step {s.get('best_step')}) | "
            f"{_num(lag.get('mean'), '{:.1f}')} "
            f"[{_num(lag.get('min'), '{:.0f}')}-{_num(lag.get('max'), '{:.0f}')}] | "
            f"{_num(d_pi_last25(met), '{:.4f}')} | "
            f"{'none' if s.get('collapse_step') is None else s['collapse_step']} | {s['wall_time_s']:.0f} |")  # fmt: skip


def _did(name: str, met: list[dict]) -> str:
    """The second table's row: what the method did to the update, from its own metrics ("—" where it logs none)."""
    from satrl.experiments.mdtext import _f as _num

    qs = sorted(r["obj/q"] for r in met if isinstance(r.get("obj/q"), float) and math.isfinite(r["obj/q"]))
    gate, changed = sat_means(met)
    v = vcpo_means(met)
    return (f"| {name} | {_num(qs[len(qs) // 2] if qs else None, '{:.3f}')} | {_num(gate, '{:.2%}')} | "
            f"{_num(changed, '{:.2%}')} | {_num(v['obj/ess_ratio'], '{:.1%}')} | {_num(v['obj/step_scale'], '{:.3f}')} "
            f"({_num(v['min_step_scale'], '{:.3f}')}) | {_num(v['obj/opob_shift'], '{:.3f}')} |")  # fmt: skip


def sat_means(met: list[dict]) -> tuple[float | None, float | None]:
    """SAT's gate rate and share of gradients changed, as run means (None where a run logs neither)."""
    gate, changed = (_mean([r.get(k) for r in met]) for k in ("obj/gate_rate", "obj/sat_clipfrac"))
    return gate, changed


def vcpo_means(met: list[dict]) -> dict[str, float | None]:
    """The run means of :data:`VCPO_METRICS` and the lowest step scale, for :func:`shown`."""
    out = {k: _mean([r.get(k) for r in met]) for k in VCPO_METRICS}
    scales = [r["obj/step_scale"] for r in met if isinstance(r.get("obj/step_scale"), float)]
    out["min_step_scale"] = min(scales) if scales else None
    return out


def _pct(x):
    """avg@k as a percentage (as in every report), None stays None."""
    return 100 * x if isinstance(x, (int, float)) else x


def _smooth(xs: list[float], w: int) -> list[float]:
    """Trailing mean over ``w`` steps: per-step d̄_π is noisy, the gap between the runs shows in its trend."""
    return [sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def _plot(out: Path, runs: dict[str, tuple[list[dict], list[dict]]]) -> str:
    """demo.png from each run's (eval rows, metric rows): reward and test avg@k, d̄_π, and what SAT's gate and
    VCPO's controls did, over steps. Returns the caption's words on what the d̄_π axis cuts off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_eval, ax_d, ax_c) = plt.subplots(1, 3, figsize=(15, 4))
    top, raw, met = 0.0, [], []
    for i, (name, (ev, met)) in enumerate(runs.items()):
        key = "test_avg_at_k" if ev and "test_avg_at_k" in ev[0] else "avg_at_k"
        steps, window, c = [r["step"] for r in met], max(1, len(met) // 10), f"C{i}"
        series = {k: [r.get(k, float("nan")) for r in met] for k in ("train/reward", "mismatch/d_pi")}
        ax_eval.plot(steps, [_pct(x) for x in _smooth(series["train/reward"], window)], color=c, alpha=0.5, lw=1,
                     label=f"{name}: train reward ({window}-step mean)")  # fmt: skip
        ax_eval.plot([r["step"] for r in ev], [_pct(r[key]) for r in ev], color=c, marker="o", ls="none",
                     label=f"{name}: test avg@k")  # fmt: skip
        ax_d.plot(steps, series["mismatch/d_pi"], color=c, alpha=0.25, lw=0.8)
        smooth = _smooth(series["mismatch/d_pi"], window)
        ax_d.plot(steps, smooth, color=c, label=f"{name} ({window}-step mean)")
        top = max([top, *(x for x in smooth if math.isfinite(x))])
        raw += [x for x in series["mismatch/d_pi"] if math.isfinite(x)]
        for k, ls, smoothed in (("obj/gate_rate", ":", True), ("obj/step_scale", "-", False),
                                ("obj/ess_ratio", "--", False)):  # fmt: skip
            ys = [r.get(k, float("nan")) for r in met]
            if any(math.isfinite(y) for y in ys):
                ax_c.plot(steps, _smooth(ys, window) if smoothed else ys, color=c, ls=ls, label=f"{name}: {k[4:]}")
    clipped = [x for x in raw if top and x > 1.15 * top]
    if met:  # the table's d̄_π window; the y-axis ends at 1.15x the highest trailing mean (caption: what it cuts)
        ax_d.axvspan(met[len(met) - math.ceil(len(met) / 4)]["step"], met[-1]["step"], color="0.9", zorder=0,
                     label="last 25 %")  # fmt: skip
        ax_d.set_ylim(0, 1.15 * top or None)
    ax_eval.set(title="Reward and test avg@k over training", xlabel="optimizer step", ylabel="%")
    ax_d.set(title="Sampled mismatch d̄_π over training", xlabel="optimizer step", ylabel="mean |log π/μ|")
    ax_c.set(title="What the corrections did", xlabel="optimizer step", ylabel="fraction", ylim=(0, 1.05))
    for ax in (ax_eval, ax_d, ax_c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "demo.png", dpi=110)
    plt.close(fig)
    if not clipped:
        return "the axis ends at 1.15x the highest trailing mean; no single step lies above it"
    return (f"the axis ends at 1.15x the highest trailing mean, which cuts off {len(clipped)} single-step "
            f"spike{'s' if len(clipped) != 1 else ''} (up to {max(clipped):.3f})")  # fmt: skip


CAPTION = (
    "*avg@k in %. Left: the training reward (mean 0/1 reward of each step's samples, trailing mean) and avg@k on\n"
    "the test problems (mean over k samples per problem; the best step is chosen on the separate val problems).\n"
    "Middle: d̄_π (`mismatch/d_pi`), the mean |log π − log μ| over active tokens at each optimizer step (faint)\n"
    "and its trailing mean; shaded: the table's d̄_π window; {cut}. Right: SAT's gate rate (share of tokens\n"
    "whose trust region SAT contracts, `obj/gate_rate`, trailing mean) and VCPO's step scale (the lr's\n"
    "multiplier, `obj/step_scale`) and ESS / batch (`obj/ess_ratio`). Gradients SAT changed: `obj/sat_clipfrac`;\n"
    "baseline shift: `obj/opob_shift`, |b_g − mean_g R| in reward units (docs/metrics.md).*"
)


def write_report(out: Path, runs: dict[str, Path], lag: int = 8) -> Path:
    """report.md with one PNG (:func:`_plot`): a table of scores, a table of what each method did to the update,
    and what this seed shows and cannot show."""
    data = {name: (_read(path / "eval.jsonl"), _read(path / "metrics.jsonl")) for name, path in runs.items()}
    cut = _plot(out, data)
    rows = [_row(name, runs[name], met) for name, (_, met) in data.items()]
    did = [_did(name, met) for name, (_, met) in data.items()]
    d_pi = {name: d_pi_last25(met) for name, (_, met) in data.items()}
    lags = [(json.loads((p / "summary.json").read_text()).get("lag_realized") or {}).get("mean") for p in runs.values()]
    sat = data.get("sat_grpo", ([], []))[1]
    gate, changed = sat_means(sat)
    vcpo = vcpo_means(data["vcpo"][1]) if "vcpo" in data else None
    ev, met = next(reversed(data.values()), ([], []))
    last = ev[-1] if ev else {}
    sizes = f"{last.get('val_n', '?')} val + {last.get('test_n', '?')} test problems, the trials' on 80 + 100"
    report = out / "report.md"
    report.write_text(
        f"# satrl demo: {', '.join(runs)} at broadcast lag {lag}, side by side on the local backend\n\n"
        f"One seed each, {met[-1]['step'] if met else 0} steps in the SAT and repair trials' regime (the trials ran "
        f"600; evals here on {sizes}):\na preview of the pipeline and of what each method does, not evidence. The "
        "pre-registered 10-seed trials are\n`satrl grid configs/grids/sat_trial.yaml` and "
        "`configs/grids/repair_trial.yaml` (docs/results/).\n\n"
        "| run | late test avg@k | test avg@k at the val-best step | realized lag: mean [min-max] "
        "| d̄_π (last 25%) | collapse step (eval rule) | wall s |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "What each method did to the update (run means; — where a method has no such control):\n\n"
        "| run | SAT: median q | SAT: gate rate | SAT: gradients changed | VCPO: ESS / batch "
        "| VCPO: step scale (lowest) | VCPO: baseline shift |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(did) + "\n\n![eval and mismatch](demo.png)\n\n"
        f"{CAPTION.format(cut=cut)}\n\n{shown(d_pi, gate, changed, _mean(lags), lag, vcpo)}\n\n{LOOK_FOR}\n"
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
    # One thread per process: three runs x (trainer + engine) share the cores, and the trial's numbers are 1-thread.
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
    trained = ", ".join(cmds) + " side by side" if len(cmds) > 1 else " ".join(cmds) or "nothing (all finished)"
    print(f"demo: trained {trained} in {time.monotonic() - t0:.0f} s; report: {report}")
    return 0
