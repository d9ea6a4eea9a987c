import gzip
import json
import math

import pytest

from satrl.experiments.report import build_report, hypothesis_mixed_seeds, mixed_seeds
from satrl.experiments.store import find_runs, load_evals, load_metrics, load_results, load_runs, pack_results


def _grid(tmp_path, make_run):
    out = tmp_path / "out"
    make_run(out, "grpo", 8, 0, {"best_avg_at_k": 0.3, "best_step": 10, "collapse_step": None},
             metrics=[{"step": 1, "mismatch/d_pi": 0.01}, {"step": 2, "mismatch/d_pi": 0.02, "obj/gate_rate": 0.1}],
             evals=[{"step": 0, "avg_at_k": 0.1, "k": 8}, {"step": 2, "avg_at_k": 0.3, "k": 8}])  # fmt: skip
    make_run(out, "grpo", 8, 1, {"best_avg_at_k": 0.5}, metrics=[{"step": 1, "mismatch/d_pi": 0.03}])
    partial = make_run(out, "sat", 1, 0, None, metrics=[{"step": 1, "loss": 1.0}])
    (partial / "checkpoints").mkdir()
    (partial / "checkpoints" / "model.pt").write_bytes(b"weights")
    with open(partial / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')  # killed mid-write
    failed = make_run(out, "sat", 1, 1, None)
    (failed / "error.txt").write_text("exit code 1\n")
    (out / "not_a_run").mkdir()
    return out


def test_load_runs_tolerates_missing_files_and_keys(tmp_path, make_run):
    out = _grid(tmp_path, make_run)
    assert [r.name for r in find_runs(out)] == [
        "grpo/lag8/seed0",
        "grpo/lag8/seed1",
        "sat/lag1/seed0",
        "sat/lag1/seed1",
    ]
    runs = load_runs(out).set_index("run")
    assert runs.loc["grpo/lag8/seed0", "best_avg_at_k"] == 0.3
    assert math.isnan(runs.loc["grpo/lag8/seed1", "best_step"])  # key absent from that summary
    assert runs["status"].to_dict() == {"grpo/lag8/seed0": "finished", "grpo/lag8/seed1": "finished",
                                        "sat/lag1/seed0": "partial", "sat/lag1/seed1": "failed"}  # fmt: skip
    m = load_metrics(out)
    assert len(m) == 4  # the truncated line is skipped
    assert m[m["cell"] == "grpo"]["mismatch/d_pi"].tolist() == [0.01, 0.02, 0.03]
    assert math.isnan(m.iloc[0]["obj/gate_rate"])
    ev = load_evals(out)
    assert ev["avg_at_k"].tolist() == [0.1, 0.3] and ev["lag"].tolist() == [8, 8]


def test_empty_folder_gives_empty_frames(tmp_path):
    res = load_results(tmp_path)
    assert res.runs.empty and res.metrics.empty and res.evals.empty
    with pytest.raises(ValueError, match="no such grid output folder"):
        load_results(tmp_path / "missing")


def test_pack_results_copies_finished_runs_without_checkpoints(tmp_path, make_run):
    out = _grid(tmp_path, make_run)
    (out / "grid.yaml").write_text("name: g\n")
    (out / "grpo/lag8/seed0/checkpoints").mkdir()
    (out / "grpo/lag8/seed0/stdout.log").write_text("log")
    dest = tmp_path / "packed"
    written = pack_results(out, dest)
    rel = sorted(p.relative_to(dest).as_posix() for p in written)
    assert rel == ["grid.yaml"] + [f"grpo/lag8/seed{s}/{f}" for s in (0, 1)
                                   for f in ("config.yaml", "eval.jsonl", "metrics.jsonl.gz", "summary.json")]  # fmt: skip
    assert not list(dest.rglob("checkpoints")) and not list(dest.rglob("*.log"))
    with gzip.open(dest / "grpo/lag8/seed0/metrics.jsonl.gz", "rt") as f:
        assert [json.loads(x)["step"] for x in f] == [1, 2]
    again = tmp_path / "packed2"
    pack_results(out, again)  # deterministic bytes: committing twice changes nothing
    assert (again / "grpo/lag8/seed0/metrics.jsonl.gz").read_bytes() == (
        dest / "grpo/lag8/seed0/metrics.jsonl.gz"
    ).read_bytes()
    packed = load_results(dest)
    assert packed.metrics["mismatch/d_pi"].tolist() == [0.01, 0.02, 0.03]  # read back from .gz
    assert packed.runs["best_avg_at_k"].tolist() == [0.3, 0.5]


def test_pack_results_writes_no_machine_paths(tmp_path, make_run):
    """Packed results are committed: the grid folder, checkouts' configs and the interpreter become portable."""
    from satrl.experiments.store import portable

    out = tmp_path / "runs" / "g"
    d = make_run(out, "grpo", 8, 0, {"best_avg_at_k": 0.3})
    (d / "config.yaml").write_text(f"out: {d}\nseed: 0\n")
    status = {"command": ["/opt/wt/src/satrl/__main__.py", "grid", "/opt/wt/configs/grids/g.yaml"],
              "runs": {"grpo/lag8/seed0": {"command": ["/home/u/.venv/bin/python3.11", "-m", "satrl", "train",
                                                       "/opt/wt/configs/grids/../grpo.yaml", f"out={d}"]}}}  # fmt: skip
    (out / "grid_status.json").write_text(json.dumps(status))
    (out / "grid.yaml").write_text("cells:\n  grpo: {base: /opt/wt/configs/grids/../grpo.yaml}\n")
    dest = tmp_path / "packed"
    pack_results(out, dest)
    for p in dest.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".yaml", ".jsonl"):
            text = p.read_text()
            assert str(tmp_path) not in text and "/opt/" not in text and "/home/" not in text, (p, text)
    got = json.loads((dest / "grid_status.json").read_text())
    assert got["command"] == ["satrl", "grid", "configs/grids/g.yaml"]
    assert got["runs"]["grpo/lag8/seed0"]["command"] == [
        "python", "-m", "satrl", "train", "configs/grids/../grpo.yaml", "out=runs/g/grpo/lag8/seed0"]  # fmt: skip
    assert (dest / "grpo/lag8/seed0/config.yaml").read_text() == "out: runs/g/grpo/lag8/seed0\nseed: 0\n"
    assert portable("python -m satrl train x.yaml", out) == "python -m satrl train x.yaml"  # nothing to change


def test_environment_json_is_packed_and_read_as_the_machine_column(tmp_path, make_run):
    out = _grid(tmp_path, make_run)
    (out / "grpo/lag8/seed0/environment.json").write_text(json.dumps({"sessions": [
        {"from_step": 0, "cpu": {"vendor": "AuthenticAMD", "model": "AMD EPYC 7B13"}},
        {"from_step": 40, "cpu": {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Processor"}}]}))
    dest = tmp_path / "packed"
    assert dest / "grpo/lag8/seed0/environment.json" in pack_results(out, dest)
    runs = load_results(dest).runs.sort_values("seed")
    assert runs["machine"].iloc[0] == "AuthenticAMD AMD EPYC 7B13 then GenuineIntel Intel(R) Xeon(R) Processor"
    assert runs["machine"].isna().tolist() == [False, True]  # a run from before environment.json
    md = build_report(dest, n_resamples=200).read_text()
    assert ("- Machines (CPU kind per run, `environment.json`; runs are bit-identical only on one kind): 1 on "
            "AuthenticAMD AMD EPYC 7B13 then GenuineIntel Intel(R) Xeon(R) Processor; 1 not recorded.") in md
    assert "different CPU kinds" not in md  # one recorded run per seed: nothing to flag
    (dest / "grpo/lag8/seed0/environment.json").unlink()
    assert "- Machines" not in build_report(dest, n_resamples=200).read_text()  # nothing recorded: no line


def test_a_seed_whose_paired_runs_ran_on_different_cpu_kinds_is_flagged(tmp_path, make_run):
    out = tmp_path / "out"
    for cell, vendor in (("grpo", "GenuineIntel"), ("sat", "AuthenticAMD"), ("ppo", "GenuineIntel")):
        for seed in (0, 1):
            d = make_run(out, cell, 8, seed, {"late_test_avg_at_k": 0.5 + seed / 10})
            kind = vendor if seed == 0 else "GenuineIntel"  # seed 1: all on one kind
            (d / "environment.json").write_text(json.dumps({"sessions": [{"cpu": {"vendor": kind, "model": "X"}}]}))
    res = load_results(out)
    assert mixed_seeds(res.runs) == {0: {"AuthenticAMD X": ["sat/lag8"], "GenuineIntel X": ["grpo/lag8", "ppo/lag8"]}}
    md = build_report(out, n_resamples=200).read_text()
    assert ("- **Seed 0's paired runs ran on different CPU kinds** (every comparison pairs runs by seed, so its "
            "differences on this seed mix in a machine difference): sat/lag8 on AuthenticAMD X; grpo/lag8, ppo/lag8 "
            "on GenuineIntel X.") in md
    assert "Seed 1's" not in md


def test_declared_hypotheses_say_whether_their_own_pairs_mix_cpu_kinds(tmp_path, make_run):
    """A staged trial's later cells share seeds with earlier cells run on another machine: the seed is flagged,
    and each declared hypothesis says whether its own pairs are on one kind."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(
        "baseline: grpo\ncells: {grpo: {}, sat: {}, gspo: {}, sat_gspo: {}}\nhypotheses:\n"
        "  H1: {method: sat, base: grpo, lag: 8}\n  C1: {method: sat_gspo, base: gspo, lag: 8}\n"
        "  C2: {method: sat_gspo, base: gspo, lag: 8, seeds: [1, 1]}\n")
    # seed 0: grpo and sat on Intel, the later gspo pair on AMD (clean for C1); seed 1: sat_gspo on AMD, gspo on Intel
    kinds = {("grpo", 0): "GenuineIntel", ("sat", 0): "GenuineIntel", ("gspo", 0): "AuthenticAMD",
             ("sat_gspo", 0): "AuthenticAMD", ("grpo", 1): "GenuineIntel", ("sat", 1): "GenuineIntel",
             ("gspo", 1): "GenuineIntel", ("sat_gspo", 1): "AuthenticAMD"}  # fmt: skip
    for (cell, seed), vendor in kinds.items():
        d = make_run(out, cell, 8, seed, {"late_test_avg_at_k": 0.5})
        (d / "environment.json").write_text(json.dumps({"sessions": [{"cpu": {"vendor": vendor, "model": "X"}}]}))
    res = load_results(out)
    assert hypothesis_mixed_seeds(res.runs, res.meta["hypotheses"]) == {"H1": [], "C1": [1], "C2": [1]}
    md = build_report(out, n_resamples=200).read_text()
    assert ("- Declared hypotheses (their own pairs only): each pair on one kind in H1; C1 pairs across kinds on "
            "seed(s) 1; C2 pairs across kinds on seed(s) 1.") in md


def _status(started, cpu, runs, history=()):
    return {"grid": "g", "command": ["satrl", "grid"], "cpu": cpu, "started": started, "updated": started,
            "history": list(history), "counts": {}, "runs": {n: {"status": s} for n, s in runs.items()}}


def test_packing_a_second_session_merges_its_status_into_the_packed_one(tmp_path, make_run):
    """Two machines resume one grid from a pack: the second pack keeps the first's history and the records of the
    runs it finished (the second session only skipped them); packing the same status again changes nothing."""
    first, second, dest = tmp_path / "m1", tmp_path / "m2", tmp_path / "packed"
    make_run(first, "grpo", 8, 0, {"best_avg_at_k": 0.3})
    (first / "grid_status.json").write_text(json.dumps(_status(
        "2026-01-01T10:00:00", "Intel", {"grpo/lag8/seed0": "finished", "grpo/lag8/seed1": "running"})))
    pack_results(first, dest)
    make_run(second, "grpo", 8, 1, {"best_avg_at_k": 0.5})
    earlier = _status("2026-01-01T09:00:00", "Intel", {})  # a history entry both files hold
    (second / "grid_status.json").write_text(json.dumps(_status(
        "2026-01-02T10:00:00", "AMD", {"grpo/lag8/seed0": "skipped", "grpo/lag8/seed1": "finished"},
        history=[earlier | {"finished": []}])))
    old = json.loads((dest / "grid_status.json").read_text())
    old["history"] = [earlier | {"finished": []}]
    (dest / "grid_status.json").write_text(json.dumps(old))
    pack_results(second, dest)
    merged = json.loads((dest / "grid_status.json").read_text())
    assert [h["started"] for h in merged["history"]] == ["2026-01-01T09:00:00", "2026-01-01T10:00:00"]
    assert merged["history"][1]["finished"] == ["grpo/lag8/seed0"] and merged["history"][1]["cpu"] == "Intel"
    assert merged["started"] == "2026-01-02T10:00:00" and merged["cpu"] == "AMD"
    assert merged["runs"] == {"grpo/lag8/seed0": {"status": "finished"}, "grpo/lag8/seed1": {"status": "finished"}}
    assert merged["counts"] == {"finished": 2}
    pack_results(second, dest)  # the same pack again
    assert json.loads((dest / "grid_status.json").read_text()) == merged
    assert {r.seed for r in find_runs(dest)} == {0, 1}


def test_a_grid_records_its_command_without_the_users_paths(monkeypatch):
    """grid_status.json's command (the report's "Runs produced by") is `satrl ...`, not the path of the virtual
    environment's script or of satrl/__main__.py (issue 60)."""
    from satrl.experiments.grid import invocation

    for argv0 in ("/home/u/project/.venv/bin/satrl", "/home/u/satrl/src/satrl/__main__.py"):
        monkeypatch.setattr("sys.argv", [argv0, "grid", "configs/grids/g.yaml", "--workers", "2"])
        assert invocation() == ["satrl", "grid", "configs/grids/g.yaml", "--workers", "2"]


def test_runs_made_at_two_commits_are_counted_by_commit_in_the_report(tmp_path, make_run):
    """A grid resumed on a later commit (stage 2 of a trial): the report counts the runs at each commit with their
    cells; runs at one commit add no line (the "Runs produced by" line names it)."""
    out = tmp_path / "out"
    for cell, commit in (("grpo", "a" * 40), ("opob", "b" * 40)):
        for seed in (0, 1):
            d = make_run(out, cell, 8, seed, {"late_test_avg_at_k": 0.5 + seed / 10})
            (d / "environment.json").write_text(json.dumps({"sessions": [{"git_commit": commit}]}))
    assert load_results(out).runs.sort_values(["cell", "seed"])["commit"].tolist() == ["a" * 8] * 2 + ["b" * 8] * 2
    md = build_report(out, n_resamples=200).read_text()
    assert ("- Code commits (per run, `environment.json`; the Runs produced by line names the last grid session's): "
            "2 at aaaaaaaa (grpo); 2 at bbbbbbbb (opob).") in md
    for seed in (0, 1):
        (out / f"opob/lag8/seed{seed}/environment.json").write_text(json.dumps({"sessions": [{"git_commit": "a" * 40}]}))
    assert "- Code commits" not in build_report(out, n_resamples=200).read_text()
