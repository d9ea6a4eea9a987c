"""environment.json: what a run's bits depend on (code and machine kind), one entry per session."""

import json

import torch
import transformers

from satrl import provenance
from satrl.provenance import ENVIRONMENT, cpu_kind, machine_label, read_sessions, record_session

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
