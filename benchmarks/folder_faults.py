"""Damaged and contested run folders for the chaos suite (issue 26): each case below changes a copy of one
finished tiny run, runs the real CLI on it, and checks the one outcome that loses nothing.

    python -m benchmarks.folder_faults          # these cases alone (about a minute on 2 cores)

Cases: a metrics line cut inside the log and a metrics line deleted (``--resume`` exits 2 naming
file:line, the log untouched, no summary); a torn last line (dropped with a one-line warning, the run
completes); the run folder locked by another process (exit 2 naming its pid; once free, the resume works);
``out=`` an ordinary folder (exit 2, the user's files untouched); extending a finished run with
``--resume DIR steps=<more>`` (it completes); a grid edited and rerun into the same ``--out`` (exit 2 naming
what changed, grid.yaml untouched). Issue 34: an emptied or edited config.yaml, a resume that changes the seed
and method, the checkpoint weights deleted, a block of the weights zeroed, and a grid's base file edited (each
exit 2 with one line, the run folder byte-identical). Issue 46: eval.jsonl cut mid-line, emptied, deleted or
missing a row (each exit 2 naming eval.jsonl, the folder byte-identical). :func:`folder_faults` returns ``{"tried": n, "clean": m}``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks._tiny import TINY, env

RUN = ["steps=4", "lag.schedule=broadcast", "lag.n=2", "objective.name=sat_grpo", "seed=7", "eval.every=2"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "satrl", *args], env=env(), capture_output=True, text=True, timeout=600)


def _one_line(r: subprocess.CompletedProcess, *needles: str) -> str | None:
    """None when the command exited 2 with one stderr line holding every needle, else what went wrong."""
    lines = r.stderr.strip().splitlines()
    if r.returncode != 2 or len(lines) != 1 or not all(n in lines[0] for n in needles):
        return f"exit {r.returncode}, stderr: {r.stderr.strip()[-300:]!r}"
    return None


def _steps(d: Path) -> list:
    from satrl.jsonl import read_jsonl

    return [r.get("step") for r in read_jsonl(d / "metrics.jsonl")]


def _damaged(d: Path, cut: bool) -> str | None:
    (d / "summary.json").unlink()
    lines = (d / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:30] + "\n" if cut else ""
    (d / "metrics.jsonl").write_text("".join(lines))
    before = (d / "metrics.jsonl").read_bytes()
    bad = _one_line(_cli("train", "--resume", str(d), "--no-progress"), f"{d / 'metrics.jsonl'}:2:")
    if bad is None and ((d / "metrics.jsonl").read_bytes() != before or (d / "summary.json").exists()):
        bad = "the log was rewritten or summarized"
    return bad


def _torn_last(d: Path) -> str | None:
    (d / "summary.json").unlink()
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/rew')
    r = _cli("train", "--resume", str(d), "--no-progress")
    if r.returncode != 0 or "torn last line" not in r.stderr or _steps(d) != [1, 2, 3, 4]:
        return f"exit {r.returncode}, steps {_steps(d)}, stderr: {r.stderr.strip()[-300:]!r}"
    return None


def _locked(d: Path) -> str | None:
    (d / "summary.json").unlink()
    with open(d / ".satrl.lock", "a+") as held:  # stands in for a process training in the folder
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("424242\n")
        held.flush()
        bad = _one_line(_cli("train", "--resume", str(d), "--no-progress"), "424242")
    if bad is None and _cli("train", "--resume", str(d), "--no-progress").returncode != 0:
        bad = "the resume failed once the folder was free"
    return bad


def _ordinary_out(d: Path) -> str | None:
    mine = d.parent / "mine"
    mine.mkdir()
    files = {"config.yaml": "steps: 3\n", "eval.jsonl": '{"mine": 1}\n', "notes.txt": "keep"}
    for name, text in files.items():
        (mine / name).write_text(text)
    bad = _one_line(_cli("train", *TINY, "steps=2", f"out={mine}", "--no-progress"), f"out={mine}")
    if bad is None and {p.name: p.read_text() for p in mine.iterdir()} != files:
        bad = "the folder was written"
    return bad


def _extend(d: Path) -> str | None:
    r = _cli("train", "--resume", str(d), "steps=6", "--no-progress")
    if r.returncode != 0 or _steps(d) != list(range(1, 7)):
        return f"exit {r.returncode}, steps {_steps(d)}, stderr: {r.stderr.strip()[-300:]!r}"
    return None


def _edited_grid(d: Path) -> str | None:
    from satrl.experiments.spec import load_grid, spec_to_yaml

    out, grid = d.parent / "grid_out", d.parent / "g.yaml"
    base = d.parent / "base.yaml"
    base.write_text("{}\n")
    body = {"base": str(base), "lags": [2], "seeds": 1, "steps": 4, "extra": dict(a.split("=", 1) for a in TINY),
            "cells": {"sat": {"objective.name": "sat_grpo"}}}  # fmt: skip
    grid.write_text(json.dumps(body))
    (out / "sat" / "lag2").mkdir(parents=True)
    shutil.copytree(d, out / "sat" / "lag2" / "seed0")  # the run as the grid made it
    recorded = spec_to_yaml(load_grid(grid), 1)
    (out / "grid.yaml").write_text(recorded)
    grid.write_text(json.dumps({**body, "steps": 6}))
    bad = _one_line(_cli("grid", str(grid), "--out", str(out)), "steps: 4 -> 6", "--rerun-changed")
    if bad is None and (out / "grid.yaml").read_text() != recorded:
        bad = "grid.yaml was rewritten"
    return bad


def _tree(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".satrl.lock"}  # fmt: skip


def _refused_untouched(d: Path, damage: Callable[[Path], None], *args: str, needle: str = "") -> str | None:
    """Damage the run folder ``d``, then ``--resume`` it with ``args``: exit 2, one line, folder byte-identical."""
    damage(d)
    before = _tree(d)
    bad = _one_line(_cli("train", "--resume", str(d), *args, "--no-progress"), needle)
    if bad is None and _tree(d) != before:
        bad = "the run folder was changed"
    return bad


def _zero_block(d: Path) -> None:
    weights = d / "checkpoints" / (d / "checkpoints" / "latest").read_text().strip() / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))


def _eval_cut(d: Path) -> None:  # the file cut inside its last row (the step-4 evaluation)
    text = (d / "eval.jsonl").read_text()
    last = text.splitlines(keepends=True)[-1]
    (d / "eval.jsonl").write_text(text[: len(text) - len(last) + 25])


def _eval_row_removed(d: Path) -> None:  # the step-2 evaluation gone
    lines = (d / "eval.jsonl").read_text().splitlines(keepends=True)
    (d / "eval.jsonl").write_text("".join(lines[:1] + lines[2:]))


def _no_weights(d: Path) -> None:
    for p in (d / "checkpoints").glob("step-*/model.safetensors"):
        p.unlink()


def _edited_base(d: Path) -> str | None:
    from satrl.config import load_config
    from satrl.experiments.spec import expand, load_grid, spec_to_yaml

    out, grid, base = d.parent / "grid_out", d.parent / "g.yaml", d.parent / "base.yaml"
    base.write_text("train: {lr: 0.0001}\n")
    grid.write_text(json.dumps({"base": str(base), "lags": [2], "seeds": 1, "steps": 4,
                                "cells": {"sat": {"objective.name": "sat_grpo"}}}))  # fmt: skip
    (run,) = expand(load_grid(grid), out)
    made = load_config(run.base, [*run.overrides, f"seed={run.seed}", f"out={run.run_dir}"])
    shutil.copytree(d, run.run_dir)
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(made.model_dump(mode="json"), sort_keys=False))
    (out / "grid.yaml").write_text(spec_to_yaml(load_grid(grid), 1))
    base.write_text("train: {lr: 0.001}\n")  # the base edited: the run was made at the old lr
    bad = _one_line(_cli("grid", str(grid), "--seeds", "2", "--out", str(out)), "train.lr: 0.0001 -> 0.001")
    if bad is None and not (run.run_dir / "summary.json").exists():
        bad = "the run was moved or rewritten"
    return bad


CASES: dict[str, Callable[[Path], str | None]] = {
    "metrics line cut inside the log": lambda d: _damaged(d, cut=True),
    "metrics line deleted": lambda d: _damaged(d, cut=False),
    "torn last metrics line": _torn_last,
    "run folder locked": _locked,
    "out= an ordinary folder": _ordinary_out,
    "finished run extended": _extend,
    "grid edited into the same --out": _edited_grid,
    "config.yaml emptied": lambda d: _refused_untouched(d, lambda d: (d / "config.yaml").write_text(""), "steps=6",
                                                        needle="config.yaml"),
    "config.yaml edited": lambda d: _refused_untouched(
        d, lambda d: (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("seed: 7", "seed: 8")),
        needle="config.yaml"),
    "resume changing seed and method": lambda d: _refused_untouched(d, lambda d: None, "seed=9", "objective.name=grpo",
                                                                    needle="seed"),
    "checkpoint weights deleted": lambda d: _refused_untouched(d, _no_weights, "steps=6", needle="model.safetensors"),
    "checkpoint weights damaged": lambda d: _refused_untouched(d, _zero_block, needle="checksum"),
    "grid base file edited": _edited_base,
    # issue 46, item 4: a damaged eval log is refused, not resumed past
    "eval line cut mid-line": lambda d: _refused_untouched(d, _eval_cut, needle=f"{d / 'eval.jsonl'}:3:"),
    "eval.jsonl emptied": lambda d: _refused_untouched(
        d, lambda d: (d / "eval.jsonl").write_text(""), needle=f"{d / 'eval.jsonl'}: the log is empty"),
    "eval.jsonl deleted": lambda d: _refused_untouched(
        d, lambda d: (d / "eval.jsonl").unlink(), needle=f"{d / 'eval.jsonl'}: the log is missing"),
    "eval row removed": lambda d: _refused_untouched(d, _eval_row_removed, needle=f"{d / 'eval.jsonl'}:2:"),
}


def folder_faults(work: Path, log=print) -> dict:
    """Every case of :data:`CASES` on its own copy of one finished run: ``{"tried": n, "clean": m}``."""
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    ref = work / "finished"
    train(load_config(None, [*TINY, *RUN, f"out={ref}"]))
    clean = 0
    for i, (name, case) in enumerate(CASES.items()):
        d = work / f"case{i}" / "run"
        shutil.copytree(ref, d)
        problem = case(d)
        clean += problem is None
        if problem is not None:
            log(f"not clean: {name}: {problem}")
    return {"tried": len(CASES), "clean": clean}


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        res = folder_faults(Path(tmp))
    print(f"run folders {res['tried']} tried / {res['clean']} clean")
    return 0 if res["clean"] == res["tried"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
