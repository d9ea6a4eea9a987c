"""`satrl demo`: both runs side by side, report.md and its PNG; its regime is the SAT trial's but for the declared
changes; and what its caption promises (d̄_π lower under SAT-GRPO at its step count, the gate acting) holds on
the trial's own runs cut to the demo's length."""

import gzip
import json
import re
import signal

from run_helpers import REPO, TINY
from satrl import cli

TRIAL_RUNS = REPO / "docs" / "results" / "sat_trial"


def _demo_in_process(capfd, *argv: str) -> tuple[int, str, str]:
    """`satrl demo` through ``cli.main`` in this process (its three runs are still child processes): a fresh
    interpreter for the demo itself would only add satrl's imports. The SIGTERM handler it sets is put back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        code = cli.main(["demo", *argv])
    finally:
        signal.signal(signal.SIGTERM, before)
    cap = capfd.readouterr()
    return code, cap.out, cap.err


def test_demo_writes_report_with_its_three_runs(tmp_path, capfd):
    out = tmp_path / "demo"
    code, stdout, stderr = _demo_in_process(capfd, "--out", str(out), "--steps", "2", "--lag", "2", *TINY)
    assert code == 0, stderr[-2000:]
    report = (out / "report.md").read_text()
    # each run twice: its scores, and what its controls did (VCPO's ESS and step scale are numbers, GRPO's "—")
    assert all(report.count(f"| {m} |") == 2 for m in ("grpo", "sat_grpo", "vcpo")), report
    vcpo_did = report.splitlines()[[i for i, line in enumerate(report.splitlines()) if line.startswith("| vcpo |")][1]]
    assert re.match(r"\| vcpo \| — \| — \| — \| \d+\.\d% \| \d\.\d{3} \(\d\.\d{3}\) \| \d\.\d{3} \|$", vcpo_did), vcpo_did
    assert "VCPO's step size" in report and "VCPO's baseline" in report
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for method in ("grpo", "sat_grpo", "vcpo"):
        assert (out / method / "summary.json").exists()
        # every run's progress reached the demo's stdout (they run as child processes)
        assert f"{out / method} step 2/2" in stdout


def test_demo_bad_override_is_one_line_exit_2(tmp_path, capfd):
    code, _, stderr = _demo_in_process(capfd, "--out", str(tmp_path / "d"), "train.lr=-1")
    assert code == 2 and "train.lr" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "d").exists()


def test_demo_regime_is_the_trials_but_for_its_declared_changes():
    """`make demo` previews the trial: its settings equal configs/grids/sat_trial.yaml's except CHANGES."""
    from satrl.apps.demo import CHANGES, REGIME, TRIAL
    from satrl.experiments.spec import load_grid

    spec = load_grid(REPO / "configs" / "grids" / "sat_trial.yaml")
    trial = {k: v for k, v in spec.extra.items() if k not in CHANGES}
    trial["lag.schedule"] = spec.lag_schedule
    assert TRIAL == trial and REGIME == {**TRIAL, **CHANGES}
    assert set(CHANGES) == {"backend", "steps", "eval.every", "eval.val_problems", "eval.test_problems",
                            "diagnostics.decompose"} and CHANGES["backend"] == "local"  # fmt: skip
    assert {"grpo", "sat_grpo"} <= set(spec.cells) and 8 in spec.lags


def _metrics(cell: str, seed: int, steps: int) -> list[dict]:
    with gzip.open(TRIAL_RUNS / cell / "lag8" / f"seed{seed}" / "metrics.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f][:steps]


def test_what_the_demo_shows_holds_on_the_trial_seeds_at_its_length():
    """Training does not depend on the step budget (constant lr), so the first `steps` steps of a trial run are the
    demo run of that seed (on the trial's CPU kind). At the demo's length, SAT-GRPO's d̄_π over the last 25 % of
    steps is below GRPO's on as many seeds as LOOK_FOR says (at least 9 of 10; 40 steps: 9, the tenth 2 % above),
    and its gate acts (obj/gate_rate and obj/sat_clipfrac > 0) on every seed. Shortening the demo past what this
    holds for fails here."""
    from satrl.apps.demo import LOOK_FOR, REGIME, _mean, d_pi_last25

    steps, below = REGIME["steps"], 0
    for seed in range(10):
        grpo, sat = _metrics("grpo", seed, steps), _metrics("sat_grpo", seed, steps)
        assert len(grpo) == len(sat) == steps
        below += d_pi_last25(sat) < d_pi_last25(grpo)
        assert _mean([r["obj/gate_rate"] for r in sat]) > 0 and _mean([r["obj/sat_clipfrac"] for r in sat]) > 0
    count = "all 10" if below == 10 else f"{below} of 10"
    assert below >= 9 and f"at this demo's {steps} steps SAT-GRPO's d̄_π is below GRPO's on {count} seeds" in LOOK_FOR


def test_what_this_run_shows_is_worded_from_its_numbers():
    """The report's claims about this seed follow its metrics: d̄_π below or not, the gate acting or not."""
    from satrl.apps.demo import shown

    lower = shown({"grpo": 0.035, "sat_grpo": 0.024}, 0.097, 0.018, 4.4, 8)
    assert "below GRPO's (0.0240 vs 0.0350, 31% lower)" in lower and "contracted the trust region on 9.7%" in lower
    higher = shown({"grpo": 0.024, "sat_grpo": 0.035}, 0.097, 0.018, 4.4, 8)
    assert "not below GRPO's this time (0.0350 vs 0.0240)" in higher and "below GRPO's (" not in higher
    idle = shown({"grpo": 0.03, "sat_grpo": 0.02}, 0.0, 0.0, 1.0, 8)
    assert "did not change any gradient" in idle and "contracted" not in idle
    assert "cannot be compared" in shown({"grpo": None, "sat_grpo": 0.02}, 0.1, 0.01, None, 8)


def test_the_demos_eval_and_diagnostics_changes_do_not_change_what_is_trained(tmp_path):
    """CHANGES may cut evals and the d̄_π split only because neither changes training: with the trial's eval
    settings and the split, or the demo's, every metric of every step is the same but the split's own."""
    from run_helpers import stable
    from satrl.apps.demo import CHANGES
    from satrl.config import load_config
    from satrl.jsonl import read_jsonl
    from satrl.loop.orchestrator import train

    demo = [f"{k}={str(v).lower()}" for k, v in CHANGES.items() if k.startswith(("eval.", "diagnostics."))]
    trial = ["eval.every=1", "eval.val_problems=4", "eval.test_problems=4", "diagnostics.decompose=true"]
    rows = {}
    for name, extra in (("trial", trial), ("demo", demo)):
        train(load_config(None, [*TINY, "objective.name=sat_grpo", "lag.n=2", "steps=3", "eval.at_start=true",
                                 *extra, f"out={tmp_path / name}"]))  # fmt: skip
        rows[name] = [{k: v for k, v in r.items() if not k.startswith(("mismatch/d_policy", "mismatch/d_impl",
                       "mismatch/frac_"))} for r in stable(read_jsonl(tmp_path / name / "metrics.jsonl"))]  # fmt: skip
    assert rows["trial"] == rows["demo"] and len(rows["demo"]) == 3


def test_what_one_seed_cannot_show_quotes_the_findings_it_names():
    """Every interval and point estimate LOOK_FOR quotes is in the findings it names (as the README's are,
    tests/test_readme_front.py), so a re-analysis that changes a number fails here until the demo says it too."""
    from satrl.apps.demo import LOOK_FOR
    from test_readme_front import INTERVAL, _norm

    named = re.findall(r"docs/results/\w+/findings\.md", LOOK_FOR)
    assert set(named) == {"docs/results/sat_trial/findings.md", "docs/results/repair_trial/findings.md",
                          "docs/results/vcpo_factorial/findings.md", "docs/results/baselines_trial/findings.md"}  # fmt: skip
    sources = _norm("".join((REPO / n).read_text() for n in named))
    quoted = INTERVAL.findall(LOOK_FOR)
    assert len(quoted) >= 5 and all(_norm(q) in sources for q in quoted), [q for q in quoted if _norm(q) not in sources]
