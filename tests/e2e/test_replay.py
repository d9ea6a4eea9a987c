"""Bit-identical replay of every shipped method config against tests/data/replay.json (see tests/e2e/replay.py).

A metric key that the record has must have exactly the recorded value at every step; keys added since the
record was made are allowed (new diagnostics), keys removed are not. The record holds one run set per CPU kind;
on a kind it does not cover, only the first optimizer step is checked, to a tolerance that the recorded kinds'
own differences are tested to fit (a warning names the machine)."""

import warnings

import pytest
from replay import CONFIGS, covers, load_record, machine, replay

from run_helpers import row_diff

# At step 1 the recorded kinds differ in the 5th-7th significant digit (fp32 kernels), up to 5e-4 relative in a
# minimum over tokens (`obj/c_min`) and 1e-6 absolute in quantities that are rounding noise there (`mismatch/d_policy`
# before any update); a changed formula or a changed sample moves a metric by far more.
RTOL, ATOL = 1e-3, 1e-5


def exact_diff(got: dict, expected: dict) -> str | None:
    """Where ``got`` departs from ``expected`` (None if it has every recorded value bit for bit)."""
    for part in ("metrics", "eval"):
        if len(got[part]) != len(expected[part]):
            return f"{part}: {len(got[part])} rows, recorded {len(expected[part])}"
        for step, (g, e) in enumerate(zip(got[part], expected[part]), start=1):
            missing = sorted(set(e) - set(g))
            if missing:
                return f"{part} row {step}: keys gone: {missing}"
            diff = {k: (e[k], g[k]) for k in e if g[k] != e[k]}
            if diff:
                return f"{part} row {step}: (recorded, now) = {diff}"
    return None


def first_step_diff(got: dict, expected: dict) -> str | None:
    """Where the first optimizer step's metrics of ``got`` depart from ``expected`` beyond RTOL / ATOL."""
    if len(got["metrics"]) != len(expected["metrics"]) or not expected["metrics"]:
        return f"{len(got['metrics'])} metric rows, recorded {len(expected['metrics'])}"
    far = row_diff(expected["metrics"][0], got["metrics"][0], RTOL, ATOL)
    return f"metrics row 1: (recorded, now) = {far}" if far else None


_REPLAYED: dict[str, dict] = {}  # config -> its run's rows, in this test process


def replayed(config: str, out) -> dict:
    """``replay(config, out)``, run once per test process: test_unrecorded_kind_falls_back_to_step_one checks
    grpo.yaml's run, which its parametrized case has made already (the same settings, the same rows)."""
    if config not in _REPLAYED:
        _REPLAYED[config] = replay(config, out)
    return _REPLAYED[config]


@pytest.mark.parametrize("config", CONFIGS)
def test_replay_is_bit_identical(tmp_path, config):
    here, record = machine(), load_record()
    got = replayed(config, tmp_path / "run")
    mine = [m for m in record if covers(m, here)]
    if mine:
        diffs = [exact_diff(got, m["runs"][config]) for m in mine]
        assert None in diffs, f"{config} on {here}: {diffs[0]}"
        return
    kinds = [f"{m['vendor']} {m.get('model') or '(any model)'} {m['capability']}" for m in record]
    warnings.warn(f"no replay record for {here} (recorded: {kinds}); only step 1 checked, to rtol {RTOL}. "
                  "On an unchanged commit, `python tests/e2e/replay.py --add` records this kind.", stacklevel=1)
    diffs = [exact_diff(got, m["runs"][config]) and first_step_diff(got, m["runs"][config]) for m in record]
    assert None in diffs, f"{config} on {here}, step 1 against the nearest recorded kind: {diffs[0]}"


def _common_keys(a: dict, b: dict) -> tuple[dict, dict]:
    """Both runs cut to the metric keys both have (a kind recorded later may log diagnostics added since)."""
    keys = [set(x) & set(y) for x, y in zip(a["metrics"], b["metrics"])]
    return tuple({**r, "metrics": [{k: row[k] for k in ks} for row, ks in zip(r["metrics"], keys)]} for r in (a, b))


def test_recorded_kinds_differ_and_agree_at_step_one():
    """Each recorded kind earns its place (its bits differ from the others'), and the kinds agree at step 1
    within the tolerance used on an unrecorded kind, so that tolerance is no looser than the machines need."""
    record = load_record()
    assert {frozenset(m) for m in record} == {frozenset({"vendor", "model", "capability", "runs"})}
    for a, b in zip(record, record[1:]):
        assert not covers(a, b) and not covers(b, a), "two records cover the same machine kind"
        differ = [c for c in CONFIGS if exact_diff(a["runs"][c], b["runs"][c]) is not None]
        assert differ, f"{a['vendor']} and {b['vendor']} records are identical: one is redundant"
        far = {c: d for c in CONFIGS if (d := first_step_diff(*_common_keys(a["runs"][c], b["runs"][c])))}
        assert not far, far


def test_step_one_tolerance_catches_a_real_change():
    """The fallback can fail: a 1 % change of the loss at step 1 (less than a formula change moves it) is caught."""
    run = load_record()[0]["runs"][CONFIGS[0]]
    changed = {**run, "metrics": [{**run["metrics"][0], "loss": run["metrics"][0]["loss"] * 1.01}, *run["metrics"][1:]]}
    assert first_step_diff(run, run) is None
    assert "loss" in first_step_diff(changed, run)


def test_machine_kind_covering():
    amd_any = {"vendor": "AuthenticAMD", "model": None, "capability": "AVX2"}
    xeon = {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Processor @ 2.00GHz", "capability": "AVX512"}
    assert covers(amd_any, {"vendor": "AuthenticAMD", "model": "AMD EPYC 7B13", "capability": "AVX2"})
    assert not covers(amd_any, xeon)
    assert covers(xeon, dict(xeon)) and not covers(xeon, {**xeon, "model": "Intel(R) Xeon(R) Platinum 8481C"})
    # the advertised clock is not part of the kind (both names seen, same bits), the rest of the name is
    assert covers(xeon, {**xeon, "model": "Intel(R) Xeon(R) Processor"})
    assert covers({**xeon, "model": "Intel(R) Xeon(R) Processor"}, {**xeon, "model": "Intel(R) Xeon(R) Processor @ 3.1 GHz"})
    assert not covers(xeon, {**xeon, "model": "Intel(R) Xeon(R) Processor v2 @ 2.00GHz"})
    # the same model name with other vector kernels is another kind (an AMD EPYC with and without AVX-512)
    epyc = {"vendor": "AuthenticAMD", "model": "AMD EPYC", "capability": "AVX2"}
    assert not covers(epyc, {**epyc, "capability": "AVX512"}) and not covers({**epyc, "capability": "AVX512"}, epyc)


def test_unrecorded_kind_falls_back_to_step_one(tmp_path, monkeypatch):
    """The path a third CPU kind takes: the run is checked at step 1 against the recorded kinds, with a warning."""
    import test_replay

    monkeypatch.setattr(test_replay, "machine", lambda: {"vendor": "OtherVendor", "model": "a CPU never recorded", "capability": "AVX2"})
    with pytest.warns(UserWarning, match="no replay record"):
        test_replay.test_replay_is_bit_identical(tmp_path, "grpo.yaml")
