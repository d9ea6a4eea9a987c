"""Hostile input: malformed datasets and configs (listed in benchmarks/hostile.py) and fuzzed configs.

Every one must end cleanly: a dataset either loads and counts its bad rows, or is refused with one line
naming the file (and line); a config is refused with one line naming the key, never a traceback.
"""

import json

import pytest
import yaml
from benchmarks.hostile import BAD_CONFIGS, BAD_DATASETS, check_config, check_dataset
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from run_helpers import TINY
from satrl import cli
from satrl.config import ConfigError, RunConfig, load_config


@pytest.mark.parametrize("name", sorted(BAD_DATASETS))
def test_malformed_dataset_is_clean(tmp_path, name):
    assert check_dataset(tmp_path, name) is None


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[f"{t!r}-{o}"[:40] for t, o, _ in BAD_CONFIGS])
def test_malformed_config_is_one_line_naming_the_key(tmp_path, case):
    assert check_config(tmp_path, *case) is None


def test_cli_counts_skipped_rows_in_summary(tmp_path):
    """`satrl train` in this process (``cli.main``): what is checked is the warning and the summary, not the start-up
    of a fresh interpreter (tests/test_cli_startup.py's). Python's default filters print a UserWarning on stderr;
    here pytest records it."""
    data = tmp_path / "mixed.jsonl"
    good = "".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8))
    data.write_text(good + '{"problem": 5}\nnot json\n\n')
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="skipped 2 malformed rows"):
        code = cli.main(["train", *TINY, "steps=2", "task.name=jsonl_math", f"task.kwargs.path={data}",
                         "task.kwargs.eval_fraction=0.5", "eval.val_problems=1", "eval.test_problems=1",
                         "task.kwargs.prompt_template='{problem}'", f"out={out}", "--no-progress"])  # fmt: skip
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["data/skipped_rows"] == 2


@pytest.mark.parametrize("text", ["", "[1, 2]\n", "steps: {a: [\n", "train:\n  lr: banana\n"])
def test_cli_bad_config_file_exit_2(tmp_path, text, capfd):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    code = cli.main(["train", str(p), "--print-config"])  # in process: a traceback would fail the test here too
    err = capfd.readouterr().err
    if text == "":  # an empty file is the defaults
        assert code == 0
        return
    assert code == 2 and len(err.strip().splitlines()) == 1, err


# -- fuzz -------------------------------------------------------------------------------------------
def _keys(model=RunConfig, prefix=""):
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out += _keys(ann, f"{prefix}{name}.")
    return out


KEYS = _keys()
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)  # fmt: skip
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=6)
key = st.one_of(st.sampled_from(KEYS), st.text(min_size=0, max_size=10), st.sampled_from(KEYS).map(lambda k: k + ".x"))


def _nested(pairs):
    data = {}
    for k, v in pairs:
        node = data
        parts = k.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[parts[-1]] = v
    return data


def _accepts_or_one_line(path, overrides):
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))
        return
    assert isinstance(cfg, RunConfig)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(key, values), max_size=4), top=st.one_of(st.none(), scalars, st.lists(scalars, max_size=2)))
@example(pairs=[("objective.ratio", True)], top=None)  # a component given as neither name nor mapping (CI, 2026-12-03)
@example(pairs=[("objective.kl", [1, 2])], top=None)
def test_fuzzed_yaml_file(tmp_path, pairs, top):
    p = tmp_path / "fuzz.yaml"
    data = _nested(pairs) if top is None else top
    p.write_text(yaml.safe_dump(data, allow_unicode=True))
    _accepts_or_one_line(p, [])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(key, st.one_of(st.text(max_size=15), values.map(lambda v: yaml.safe_dump(v).strip())),
                                st.booleans()), max_size=4))  # fmt: skip
@example(items=[("objective.ratio", "True", True), ("objective.trust_region", "3", True)])
@example(items=[("objective", "", True), ("objective.ratio", "", True)])  # a component left None (found 2026-12-04)
def test_fuzzed_overrides(items):
    _accepts_or_one_line(None, [f"{k}={v}" if eq else f"{k}{v}" for k, v, eq in items])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzzed_file_bytes(tmp_path, raw):
    p = tmp_path / "raw.yaml"
    p.write_bytes(raw)
    _accepts_or_one_line(p, [])
