"""TRL's GRPOTrainer and satrl side by side on the same work (issue 57, item 4).

    python -m benchmarks.trl_side_by_side --model models/smollm2 --steps 5 --repeats 3 [--write]

The same model, task (configs/real/smollm2_side_by_side.yaml's: reasoning-gym 1-2-digit addition through the chat template,
"Reply with the number only."), reward (satrl's task scoring, called from TRL's reward function), the same prompts
in the same order (TRL's dataset is satrl's train stream, unshuffled), prompts per step, group size, response
length, lr (constant, AdamW betas (0.9, 0.98), grad clip 1.0, no weight decay), temperature 1, no KL (satrl
``objective.kl_coef=0``, TRL ``beta=0``), token-mean loss (TRL ``loss_type=dapo``), fp32 training, no activation
checkpointing, one optimizer step per rollout batch (TRL ``num_iterations=1``, ``generation_batch_size`` = the step's
P x G samples) and no evaluation in the timed steps. Rows, alternated ``--repeats`` times, each in a fresh process:

- ``satrl-lag0``: backend sequential, ``lag.schedule=sync`` (one process, generate then train, 2 threads each);
- ``satrl-lag1``: backend local, ``broadcast`` lag 1 (engine in its own process generating batch b+1 while batch b
  trains; 1 thread each, the same 2-core budget);
- ``trl``: ``GRPOTrainer`` with its own generation (transformers ``generate``), 2 threads.

Per run: wall seconds per step over steps 2..N (the first step holds start-up and, at lag 1, the one generation
nothing overlaps), CPU seconds of the process tree over the same steps, response tokens per second over them, total
CPU seconds of the run (the child's rusage, start-up and model loading included) and the reward per step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROWS = ("satrl-lag0", "satrl-lag1", "trl")
REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/real/smollm2_side_by_side.yaml"  # the task, prompt format and seed both sides use
SECTION = "TRL GRPOTrainer side by side"


@dataclass(frozen=True)
class Work:
    """What both sides train: one optimizer step = ``prompts`` x ``group`` samples of at most ``tokens`` tokens."""

    model: str
    steps: int = 5
    prompts: int = 8
    group: int = 4
    tokens: int = 16
    lr: float = 1e-6
    config: str = CONFIG


def tree_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (the local backend's engine), plus reaped children."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended between the listing and the read
            pass
    return total


def satrl_overrides(work: Work, row: str, out: Path) -> list[str]:
    lag = (["backend=sequential", "lag.schedule=sync", "train.threads=2", "engine.threads=2"] if row == "satrl-lag0"
           else ["backend=local", "lag.schedule=broadcast", "lag.n=1", "train.threads=1", "engine.threads=1"])  # fmt: skip
    return [
        f"model.path={work.model}", f"steps={work.steps}", f"train.prompts_per_batch={work.prompts}",
        f"train.group_size={work.group}", f"engine.max_new_tokens={work.tokens}", f"train.lr={work.lr}",
        "train.minibatches=1", "objective.name=grpo", "objective.kl_coef=0", "diagnostics.decompose=false",
        "eval.every=0", "eval.at_start=false", "eval.k=1", "eval.val_problems=1", "eval.test_problems=1",
        "checkpoint.every=100000", f"out={out}", *lag,
    ]  # fmt: skip


def run_satrl(work: Work, row: str, result: Path) -> None:
    from satrl.config import load_config
    from satrl.jsonl import read_jsonl
    from satrl.loop.orchestrator import train

    cpu: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"

        def on_step(version: int, *_) -> None:
            cpu.append(tree_cpu_s())
            if version == work.steps:  # written before the run's final checkpoint, whose memory peak the machine's
                rows = read_jsonl(out / "metrics.jsonl")  # other tenants may not leave room for (an OOM kill)
                result.write_text(json.dumps({
                    "step_end_s": [r["wall_s"] for r in rows], "cpu_s": cpu, "reward": [r["train/reward"] for r in rows],
                    "response_tokens": [r["train/tokens"] for r in rows],
                    # where a step's time goes: waiting for rollouts (at lag 0 the whole generation), then training
                    "gen_wait_s": [r["perf/trainer_wait_s"] for r in rows],
                    "train_s": [r["train/tokens"] / r["perf/trainer_tok_s"] for r in rows]}))  # fmt: skip

        train(load_config(REPO / work.config, satrl_overrides(work, row, out)), on_step=on_step)


def trl_dataset(work: Work, n: int) -> tuple[list[dict], dict]:
    """The first ``n`` problems of satrl's train stream as TRL's conversational rows, and the problems by index."""
    import itertools

    from satrl.config import load_config
    from satrl.models.chat import chat_messages
    from satrl.tasks import make_task

    cfg = load_config(REPO / work.config, [f"model.path={work.model}"])
    task = make_task(cfg.task.name, **cfg.task_kwargs)
    problems = list(itertools.islice(task.problems("train", cfg.seed), n))
    fmt = cfg.model.chat_format()
    rows = [{"prompt": chat_messages(p.prompt, fmt), "idx": i} for i, p in enumerate(problems)]
    return rows, {"task": task, "problems": problems, "seed": cfg.seed}


def run_trl(work: Work) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)
    rows, ctx = trl_dataset(work, work.steps * work.prompts)
    task, problems = ctx["task"], ctx["problems"]

    def reward(completions, idx, **_):  # satrl's task scoring of each completion's text
        return [task.reward(problems[i], c[-1]["content"]) for c, i in zip(completions, idx, strict=True)]

    log: dict = {"step_end_s": [], "cpu_s": [], "reward": [], "response_tokens": [], "gen_wait_s": [], "train_s": []}
    t0 = time.perf_counter()
    samples = work.prompts * work.group

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            log["step_end_s"].append(time.perf_counter() - t0)
            log["cpu_s"].append(tree_cpu_s())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                log["reward"].append(logs["reward"])
                log["response_tokens"].append(logs["completions/mean_length"] * samples)

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=samples, gradient_accumulation_steps=1,
            num_generations=work.group, generation_batch_size=samples, max_completion_length=work.tokens,
            learning_rate=work.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.98,
            weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo",
            scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, max_steps=work.steps, logging_steps=1,
            save_strategy="no", report_to=[], bf16=False, gradient_checkpointing=False, use_cpu=True,
            shuffle_dataset=False, seed=ctx["seed"], disable_tqdm=True, dataloader_num_workers=0,
        )  # fmt: skip
        model = AutoModelForCausalLM.from_pretrained(work.model, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(work.model)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                              processing_class=tok, callbacks=[Clock()])  # fmt: skip
        generate = trainer._generate_and_score_completions  # TRL's rollout: generation, rewards, advantages

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                log["gen_wait_s"].append(time.perf_counter() - t)

        trainer._generate_and_score_completions = timed
        trainer.train()
    ends = [0.0, *log["step_end_s"]]  # the rest of each step: forward, backward, optimizer
    log["train_s"] = [e - b - g for b, e, g in zip(ends, ends[1:], log["gen_wait_s"], strict=False)]
    return log


def child(row: str, work: Work, result: Path) -> None:
    if row == "trl":
        result.write_text(json.dumps(run_trl(work)))
    else:
        run_satrl(work, row, result)


def run_child(row: str, work: Work) -> dict:
    """One run in a fresh process: its log, its wall time and its CPU seconds (rusage of the reaped tree)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.trl_side_by_side", "--child", row, "--result", str(result),
               "--work", json.dumps(asdict(work))]  # fmt: skip
        load = os.getloadavg()[0]
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0 and not result.exists():
            raise RuntimeError(f"{row} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        log = json.loads(result.read_text())
    if done.returncode != 0:  # killed after its last step was recorded (the OOM killer, at the final checkpoint)
        log["exit"] = done.returncode
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"row": row, "run_wall_s": wall, "run_cpu_s": cpu, "load_1min": [load, os.getloadavg()[0]], **log}


def profile(row: str, work: Work, top: int = 40) -> str:
    """One run of ``row`` under cProfile (all of it: start-up, ``work.steps`` steps, the end): the functions with
    the most cumulative and the most own time. The local backend's engine process is not in it: profile lag 0."""
    import io
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        prof, result = Path(tmp) / "run.prof", Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "benchmarks.trl_side_by_side", "--child", row,
               "--result", str(result), "--work", json.dumps(asdict(work))]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{row} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        out = io.StringIO()
        stats = pstats.Stats(str(prof), stream=out)
        stats.sort_stats("cumulative").print_stats(top)
        stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def steady(run: dict) -> dict:
    """Steps 2..N of one run: wall and CPU seconds per step, response tokens per second."""
    ends, cpu, n = run["step_end_s"], run["cpu_s"], len(run["step_end_s"])
    if n < 2:
        raise ValueError(f"{run['row']}: {n} step(s) logged; the steady rate needs at least 2")
    span = ends[-1] - ends[0]
    return {"s_per_step": span / (n - 1), "cpu_per_step": (cpu[-1] - cpu[0]) / (n - 1),
            "tok_s": sum(run["response_tokens"][1:]) / span, "gen_s": statistics.mean(run["gen_wait_s"][1:]),
            "train_s": statistics.mean(run["train_s"][1:])}  # fmt: skip


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per row: median and min-max of each steady rate over its runs, the run CPU seconds, the reward curves."""
    out: dict[str, dict] = {}
    for row in ROWS:
        mine = [r for r in runs if r["row"] == row]
        if not mine:
            continue
        rates = [steady(r) for r in mine]
        stats = {k: _spread([x[k] for x in rates]) for k in ("s_per_step", "cpu_per_step", "tok_s", "gen_s", "train_s")}
        out[row] = {**stats, "run_cpu_s": _spread([r["run_cpu_s"] for r in mine]),
                    "run_wall_s": _spread([r["run_wall_s"] for r in mine]), "reward": [r["reward"] for r in mine]}  # fmt: skip
    if "trl" in out:
        base = out["trl"]["tok_s"]["median"]
        for row in out:
            out[row]["vs_trl"] = out[row]["tok_s"]["median"] / base
    return out


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _cell(s: dict, fmt: str) -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


HEAD = ("| row | wall s/step | CPU s/step | response tok/s | run CPU s | run wall s | tok/s vs TRL |\n"
        "|---|---|---|---|---|---|---|")  # fmt: skip


def table(summary: dict[str, dict]) -> str:
    """The markdown table: medians with (min-max) over the repeats; the last column, median tok/s over TRL's."""
    lines = [HEAD]
    for row, s in summary.items():
        ratio = f"{s['vs_trl']:.2f}x" if "vs_trl" in s else "-"
        lines.append(f"| {row} | {_cell(s['s_per_step'], '.2f')} | {_cell(s['cpu_per_step'], '.2f')} | "
                     f"{_cell(s['tok_s'], '.1f')} | {_cell(s['run_cpu_s'], '.0f')} | {_cell(s['run_wall_s'], '.0f')} "
                     f"| {ratio} |")  # fmt: skip
    return "\n".join(lines)


def parse_table(text: str) -> dict[str, dict[str, float]]:
    """The table's medians back (row -> column -> value): what the test reads, so the printed numbers are checked."""
    out: dict[str, dict[str, float]] = {}
    cols = [c.strip() for c in HEAD.splitlines()[0].strip("|").split("|")]
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(cols) and cells[0] in ROWS:
            out[cells[0]] = {c: float(v.split()[0].rstrip("x")) for c, v in zip(cols[1:], cells[1:], strict=True) if v != "-"}
    return out


def split(summary: dict[str, dict]) -> str:
    """Where a step's time goes (steps 2..N, medians): seconds the trainer waited for rollouts (satrl; at lag 0
    the whole generation) or spent in TRL's generate-and-score, and seconds training."""
    lines = ["| row | generation (waited) s/step | training s/step |", "|---|---|---|"]
    for row, s in summary.items():
        lines.append(f"| {row} | {_cell(s['gen_s'], '.2f')} | {_cell(s['train_s'], '.2f')} |")
    return "\n".join(lines)


def rewards(summary: dict[str, dict]) -> str:
    lines = ["Reward per step (each repeat):", ""]
    for row, s in summary.items():
        for i, curve in enumerate(s["reward"]):
            lines.append(f"- {row} #{i + 1}: " + " ".join(f"{x:.3f}" for x in curve))
    return "\n".join(lines)


def measure(work: Work, repeats: int, rows: tuple[str, ...] = ROWS, say=print, log: Path | None = None) -> list[dict]:
    """``repeats`` rounds, each running every row once in a fresh process, in order (alternation: a change in
    the machine's load hits every row alike). ``log``: each run appended as a JSON line when it ends, so that a
    measurement cut short keeps its finished runs (``--from-log`` summarizes them)."""
    runs = []
    for i in range(repeats):
        for row in rows:
            runs.append(run_child(row, work))
            if log is not None:
                with log.open("a") as f:
                    f.write(json.dumps(runs[-1]) + "\n")
            say(f"repeat {i + 1}/{repeats} {row}: {steady(runs[-1])['s_per_step']:.2f} s/step, "
                f"{runs[-1]['run_wall_s']:.0f} s in all")  # fmt: skip
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/smollm2", help="the Hugging Face folder `satrl convert-gguf` wrote")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks.md's section and the JSON record")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "results" / "trl_side_by_side" / "smollm2.json")
    ap.add_argument("--rows", default=",".join(ROWS), help="the rows, in the order each repeat runs them")
    ap.add_argument("--log", type=Path, help="append each finished run to this JSONL file")
    ap.add_argument("--from-log", type=Path, help="summarize the runs of a --log file instead of measuring")
    ap.add_argument("--profile", choices=ROWS, help="run this row once under cProfile and print its top functions")
    ap.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, Work(**json.loads(a.work)), a.result)
    work = Work(str(Path(a.model).resolve()), a.steps, a.prompts, a.group, a.tokens, a.lr)
    if a.profile:
        return print(profile(a.profile, work))
    if a.from_log:
        runs = [json.loads(x) for x in a.from_log.read_text().splitlines() if x.strip()]
        a.repeats = max(sum(r["row"] == row for r in runs) for row in ROWS)
    else:
        runs = measure(work, a.repeats, tuple(a.rows.split(",")), log=a.log)
    summary = summarize(runs)
    loads = [x for r in runs for x in r.get("load_1min", [])]
    kept = sum("load_1min" in r for r in runs)
    said = (f"Load average (1 min) {min(loads):.1f}-{max(loads):.1f} at the starts and ends of the {kept} of "
            f"{len(runs)} runs that recorded it (about 2: the runs' own two threads; more: other work beside them)." if loads else "The runs recorded no load average.")  # fmt: skip
    body = (f"{a.prompts} prompts x {a.group} samples per step, responses of at most {a.tokens} tokens, lr {a.lr:g}, "
            f"{a.steps} steps per run, {a.repeats} runs per row alternated; medians (min-max) over the runs, "
            f"rates over steps 2..{a.steps}. {said}\n\n" + table(summary) + "\n\nWhere a step's time goes:\n\n" + split(summary) + "\n\n"
            + rewards(summary))  # fmt: skip
    print(body)
    if a.write:
        from benchmarks._report import machine, write_section

        size = (f"--model {a.model} --steps {a.steps} --prompts {a.prompts} --group {a.group} --tokens {a.tokens} "
                f"--lr {a.lr:g}")  # fmt: skip
        cmd = f"python -m benchmarks.trl_side_by_side {size} --repeats {a.repeats} --rows {a.rows}"
        if a.from_log:  # measured into a log (perhaps in several invocations), then summarized
            cmd += f" --log runs.jsonl; python -m benchmarks.trl_side_by_side {size} --from-log runs.jsonl --write"
        else:
            cmd += " --write"
        write_section(SECTION, cmd, body)
        record = {"command": cmd, "machine": machine(), "date": time.strftime("%Y-%m-%d"), "work": {**asdict(work), "model": a.model}, "summary": summary, "runs": runs}  # fmt: skip
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
