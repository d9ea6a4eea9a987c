"""environment.json: what a run's bits depend on (code and machine kind), one entry per session."""

import json

import pytest
import torch
import transformers

from satrl import provenance
from satrl.provenance import ENVIRONMENT, commit_label, cpu_kind, machine_label, read_sessions, record_session

XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.00GHz\n\n" \
       "processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.00GHz\n"


def test_cpu_kind_reads_the_first_core():
    assert cpu_kind(XEON) == {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Processor @ 2.00GHz"}
    assert cpu_kind("") == {"vendor": None, "model": None}  # no /proc/cpuinfo (macOS): unknown, not an error
    assert cpu_kind("vendor_id : AuthenticAMD\n") == {"vendor": "AuthenticAMD", "model": None}


def test_environment_names_code_kernels_and_versions():
    env = provenance.environment(threads=3)
    assert env["torch"] == torch.__version__ and env["threads"] == 3
    assert env["transformers"] == transformers.__version__
    assert env["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    json.dumps(env, allow_nan=False)  # strict JSON


def test_sessions_append_on_resume_and_restart_on_a_fresh_run(tmp_path, monkeypatch):
    kinds = iter([XEON, XEON, "vendor_id : AuthenticAMD\nmodel name : AMD EPYC 7B13\n", XEON])
    monkeypatch.setattr(provenance, "cpu_kind", lambda cpuinfo=None: cpu_kind(next(kinds)))
    cap = f" ({torch.backends.cpu.get_cpu_capability()})"  # this machine's kernels, recorded with the kind
    record_session(tmp_path, 0, 1)
    assert [s["from_step"] for s in read_sessions(tmp_path)] == [0]
    assert machine_label(read_sessions(tmp_path)) == "GenuineIntel Intel(R) Xeon(R) Processor @ 2.00GHz" + cap
    record_session(tmp_path, 40, 1)  # resumed on the same kind: one kind in the label
    assert machine_label(read_sessions(tmp_path)) == "GenuineIntel Intel(R) Xeon(R) Processor @ 2.00GHz" + cap
    record_session(tmp_path, 80, 1)  # resumed on another kind
    assert [s["from_step"] for s in read_sessions(tmp_path)] == [0, 40, 80]
    assert machine_label(read_sessions(tmp_path)) == (
        f"GenuineIntel Intel(R) Xeon(R) Processor @ 2.00GHz{cap} then AuthenticAMD AMD EPYC 7B13{cap}"
    )
    record_session(tmp_path, 0, 1)  # started over (no checkpoint): the old sessions no longer describe it
    assert [s["from_step"] for s in read_sessions(tmp_path)] == [0]


def test_a_torn_or_missing_file_reads_as_no_sessions(tmp_path):
    assert read_sessions(tmp_path) == [] and machine_label([]) is None
    (tmp_path / ENVIRONMENT).write_text('{"sessions": [{"from_st')
    assert read_sessions(tmp_path) == []
    record_session(tmp_path, 12, 1)  # resuming over a torn file keeps what is known from now on
    assert [s["from_step"] for s in read_sessions(tmp_path)] == [12]
    assert machine_label([{"cpu": {}}]) == "unknown CPU"


def test_one_model_name_with_other_kernels_is_another_kind():
    """Two "AMD EPYC" machines, with and without AVX-512, differ in fp32's last digits: the label tells them apart
    (and a session from before the capability was recorded keeps the old label)."""
    amd = {"vendor": "AuthenticAMD", "model": "AMD EPYC"}
    sessions = [{"cpu": {**amd, "capability": "AVX2"}}, {"cpu": {**amd, "capability": "AVX512"}}, {"cpu": amd}]
    assert machine_label(sessions) == "AuthenticAMD AMD EPYC (AVX2) then AuthenticAMD AMD EPYC (AVX512) then " \
        "AuthenticAMD AMD EPYC"


def test_outside_git_the_commit_is_the_builds_record(tmp_path, monkeypatch):
    """An installed wheel has no git: git_commit() reads the commit its build recorded (BUILD_COMMIT)."""
    import subprocess as sp

    from satrl import provenance

    def no_git(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(sp, "run", no_git)
    record = tmp_path / "BUILD_COMMIT"
    monkeypatch.setattr(provenance, "BUILD_COMMIT", record)
    assert provenance.git_commit() is None  # neither git nor a record
    record.write_text("0123abcd+dirty\n")
    assert provenance.git_commit() == "0123abcd+dirty"


@pytest.mark.slow
def test_a_wheel_records_the_commit_it_is_built_from(tmp_path):
    """Issue 47: `satrl --version` named no commit in an installed wheel. The build backend (build_backend/)
    writes the commit into the wheel, and it is the one this checkout's code reports."""
    import subprocess as sp
    import sys
    import zipfile
    from pathlib import Path

    from satrl.provenance import git_commit

    repo = Path(__file__).resolve().parents[1]
    done = sp.run([sys.executable, "-m", "pip", "wheel", str(repo), "--no-deps", "--no-build-isolation", "-q",
                   "-w", str(tmp_path)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("satrl_async-*.whl")
    with zipfile.ZipFile(wheel) as z:
        recorded = z.read("satrl/BUILD_COMMIT").decode().strip()
    assert recorded and recorded == git_commit()


def test_the_commit_label_names_each_commit_a_run_ran_at_in_order():
    """Hand-made sessions: one commit once; a resume on a later commit; a dirty checkout; none recorded."""
    a, b = "f2d37b1188a26b06357a55c19672fd2074ee6974", "1eb83c684adc0000000000000000000000000000"
    assert commit_label([{"git_commit": a}, {"git_commit": a}]) == "f2d37b11"
    assert commit_label([{"git_commit": a}, {"git_commit": b + "+dirty"}, {}]) == "f2d37b11 then 1eb83c68+dirty"
    assert commit_label([{}, {"git_commit": None}]) is None and commit_label([]) is None
