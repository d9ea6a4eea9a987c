"""Config: overrides, validation, and the CLI's exit code 2 with a one-line message."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from satrl.config import ConfigError, load_config


def test_overrides_apply_and_parse_types():
    cfg = load_config(None, ["seed=3", "steps=12", "lag.schedule=fixed", "lag.n=8", "train.lr=3e-5", "r3=true"])
    assert (cfg.seed, cfg.steps, cfg.lag.schedule, cfg.lag.n, cfg.train.lr, cfg.r3) == (3, 12, "fixed", 8, 3e-5, True)


def test_section_shorthand_sets_name():
    assert load_config(None, ["engine=torch"]).engine.name == "torch"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("lag.schedule=sometimes", "lag.schedule"),
        ("lag.n=-1", "lag.n"),
        ("train.nope=1", "valid keys"),
        ("objective.name=ppo_magic", "grpo"),
        ("objective.alpha=2.0", "alpha"),
        ("engine.numerics=fp8", "bf16"),
        ("steps", "key=value"),
    ],
)
def test_bad_config_is_one_line_error(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize(
    "override, line",
    [
        ("lag.schedule=sometimes", "satrl train: invalid config: lag.schedule: unknown lag schedule 'sometimes'; "
                                   "valid choices: ['async', 'broadcast', 'fixed', 'sync']"),
        ("engine.name=nope", "satrl train: invalid config: engine.name: unknown engine 'nope'; "
                             "valid choices: ['torch', 'vllm']"),
    ],
)  # fmt: skip
def test_cli_bad_config_exits_2(override, line):
    proc = subprocess.run([sys.executable, "-m", "satrl", "train", override], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]


def test_missing_config_file_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "satrl", "train", str(tmp_path / "nope.yaml")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_shipped_configs_validate():
    from pathlib import Path

    configs = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))
    names = {p.stem for p in configs}
    paper = {"grpo", "gspo", "grpo_r3", "gspo_r3", "grpo_tis", "gspo_tis", "grpo_tis_r3", "gspo_tis_r3", "dppo",
             "sat_grpo", "sat_gspo", "sat_grpo_r3", "sat_gspo_r3"}
    assert paper <= names
    for p in configs:
        load_config(p)


def test_print_config_shows_resolved_overrides():
    proc = subprocess.run(
        [sys.executable, "-m", "satrl", "train", "configs/sat_grpo.yaml", "lag.n=8", "--print-config"],
        capture_output=True, text=True, cwd=str(__import__("pathlib").Path(__file__).parent.parent),
    )
    assert proc.returncode == 0, proc.stderr
    import yaml

    cfg = yaml.safe_load(proc.stdout)
    assert cfg["objective"]["name"] == "sat_grpo" and cfg["lag"]["n"] == 8 and "microbatch_tokens" in cfg["train"]


def test_qwen3_gpu_config_follows_appendix_f():
    """configs/qwen3_gpu.yaml validates and carries the paper's Appendix F settings where they apply."""
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "qwen3_gpu.yaml", [])
    spec = cfg.objective  # the config's objective is the resolved spec the trainer calls
    assert (spec.ratio.name, spec.trust_region.name, spec.correction.name, spec.kl.name) == ("token", "sat", "none", "k3")
    tr = spec.trust_region
    assert (tr.eps_low, tr.eps_high, tr.alpha, tr.exponent, spec.kl.coef) == (0.2, 0.2, 0.9, 2.0, 1e-3)
    assert (cfg.train.lr, tuple(cfg.train.betas), cfg.train.group_size, cfg.train.minibatches) == (1e-6, (0.9, 0.98), 16, 1)
    assert (cfg.engine.temperature, cfg.engine.top_p, cfg.engine.top_k) == (1.0, 1.0, 0)
    assert (cfg.lag.schedule, cfg.lag.n, cfg.eval.k) == ("broadcast", 8, 16)
    assert cfg.engine.name == "vllm" and cfg.train.device == "cuda" and cfg.model.path


def test_bad_aggregation_fails_when_the_config_loads():
    from satrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="unknown aggregation mode 'nope'; valid choices"):
        load_config(None, ["objective.aggregation=nope"])


def test_objectives_declare_what_they_need():
    from satrl.objectives import resolve_objective

    assert resolve_objective("grpo").needs == {"ref_logp"}  # k3 KL at kl_coef 1e-3
    assert resolve_objective("grpo", kl_coef=0.0).needs == frozenset()
    assert resolve_objective("grpo", kl="none").needs == frozenset()
    assert resolve_objective("grpo_tis").needs == {"ref_logp", "old_logp"}  # TIS weighs by pi_old / mu


REPO = Path(__file__).resolve().parents[1]


def test_a_sat_runs_saved_config_holds_every_hyperparameter_and_loads_back(tmp_path):
    """config.yaml is ``model_dump(mode='json')``: the objective is saved resolved (each component with every
    value, defaults included), so the run says what it ran; loading it gives the same config."""
    import yaml

    from satrl.config import build_config

    cfg = load_config(REPO / "configs" / "sat_grpo.yaml")
    saved = cfg.model_dump(mode="json")
    obj = saved["objective"]
    assert obj["name"] == "sat_grpo" and obj["ratio"] == {"name": "token"} and obj["correction"] == {"name": "none"}
    tr = obj["trust_region"]
    assert tr["name"] == "sat"
    assert (tr["alpha"], tr["exponent"], tr["eps_low"], tr["eps_high"]) == (0.9, 2.0, 0.2, 0.2)
    assert obj["kl"] == {"name": "k3", "coef": 1e-3}
    assert build_config(saved) == cfg
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg and again.model_dump(mode="json") == saved
    # an override of a saved run (as --resume applies them) reaches the saved component
    tuned = load_config(tmp_path / "config.yaml", ["objective.alpha=0.8", "objective.trust_region.exponent=1"])
    assert (tuned.objective.trust_region.alpha, tuned.objective.trust_region.exponent) == (0.8, 1.0)


@pytest.mark.parametrize("source", ["dict", "yaml"])
def test_old_flat_objective_configs_load_into_the_nested_form(source, tmp_path):
    import yaml

    from satrl.config import build_config

    old = {"objective": {"name": "sat_grpo", "alpha": 0.8, "kl_coef": 0, "shuffle": True}}
    if source == "dict":
        cfg = build_config(old)
    else:
        (tmp_path / "old.yaml").write_text(yaml.safe_dump(old), encoding="utf-8")
        cfg = load_config(tmp_path / "old.yaml")
    tr, kl = cfg.objective.trust_region, cfg.objective.kl
    assert (tr.name, tr.alpha, tr.shuffle, tr.exponent, tr.eps_high) == ("sat", 0.8, True, 2.0, 0.2)
    assert (kl.name, kl.coef) == ("k3", 0.0)
    saved = cfg.model_dump(mode="json")["objective"]
    assert not {"alpha", "kl_coef", "shuffle"} & saved.keys()  # saved nested, once
    assert saved["trust_region"]["alpha"] == 0.8 and saved["kl"]["coef"] == 0.0
    assert build_config({"objective": saved}) == cfg


def test_switching_the_preset_of_a_resolved_config_switches_its_components():
    """A saved sat_grpo config names trust_region: sat; ``objective=grpo`` on it must run PPO's trust region
    (not SAT under GRPO's name), keeping the values the new components declare."""
    from satrl.config import apply_override, build_config

    saved = load_config(REPO / "configs" / "sat_grpo.yaml", ["objective.eps_high=0.28",
                                                             "objective.kl=k1"]).model_dump(mode="json")
    for key in ("objective", "objective.name"):
        data = copy.deepcopy(saved)
        apply_override(data, key, "grpo")
        obj = build_config(data).objective
        assert obj.name == "grpo" and obj.trust_region.name == "ppo", key
        assert (obj.trust_region.eps_low, obj.trust_region.eps_high) == (0.2, 0.28)  # PPO's radii kept
        assert not hasattr(obj.trust_region, "alpha")
        assert obj.kl.name == "k1" and obj.kl.coef == 1e-3  # chosen apart from the preset: kept
    data = copy.deepcopy(saved)
    apply_override(data, "objective", "sat_gspo_tis")  # every slot the old preset chose follows the new one
    obj = build_config(data).objective
    assert (obj.ratio.name, obj.trust_region.name, obj.correction.name) == ("sequence", "sat", "tis")
    assert (obj.trust_region.eps_high, obj.trust_region.alpha) == (0.28, 0.9)
    # a flat key of the old preset's component goes with it (vcpo's ess_step, as configs/real/smollm2_arith.yaml
    # gives it), one the new preset's components declare stays
    obj = load_config(None, ["objective=vcpo", "objective.ess_step=false", "objective.eps_high=0.3",
                             "objective.name=grpo"]).objective  # fmt: skip
    assert obj.correction.name == "none" and obj.trust_region.eps_high == 0.3
    # and through load_config, as for a resumed run's saved config.yaml
    assert load_config(None, ["objective=sat_grpo", "objective=grpo"]).objective.trust_region.name == "ppo"


@pytest.mark.parametrize("override, line", [
    ("objective.trust_region.alpha=2.0", "invalid config: objective.trust_region: sat: alpha: "),
    ("objective.trust_region.nope=1", "invalid config: objective.trust_region: sat: nope: unknown key; valid keys: "
                                      "['alpha', 'dual_clip', 'eps_high', 'eps_low', 'exponent', 'invert', 'proxy', "
                                      "'shuffle']"),
    ("objective.beta=1", "invalid config: objective: unknown objective key 'beta' for ratio=token, trust_region=sat, "
                         "correction=none, kl=k3; valid keys: ['aggregation', 'alpha', "),
    # a typo suggests the nearest valid key of its section (issue 60), the objective's own fields included
    ("objective.nmae=vcpo", "invalid config: objective: unknown objective key 'nmae' (did you mean 'name'?) for "),
    ("objective.trust_region.alpah=0.5", "invalid config: objective.trust_region: sat: alpah: unknown key (did you "
                                         "mean 'alpha'?); valid keys: "),
    ("stepz=3", "invalid config: stepz: unknown key (did you mean 'steps'?); valid keys here: backend, "),
    ("train.lrr=1", "invalid config: train.lrr: unknown key (did you mean 'lr'?); valid keys here: "),
])  # fmt: skip
def test_bad_nested_objective_key_is_one_line_naming_it(override, line):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "configs" / "sat_grpo.yaml", [override])
    assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


def _float_keys(model=None, prefix=""):
    """Every float-valued config key (dotted), walking the sections; the objective's own keys are its registry's."""
    import typing

    from pydantic import BaseModel

    from satrl.config import ObjectiveConfig, RunConfig

    model = model or RunConfig
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if ann is not ObjectiveConfig:
                yield from _float_keys(ann, f"{prefix}{name}.")
        elif float in (ann, *typing.get_args(ann)):
            yield f"{prefix}{name}"
        elif typing.get_origin(ann) is tuple and float in [_plain(a) for a in typing.get_args(ann)]:
            yield f"{prefix}{name}"


def _plain(ann):
    """``Annotated[float, Field(...)]`` as ``float`` (a tuple's items may carry their own ranges)."""
    import typing

    return typing.get_args(ann)[0] if typing.get_origin(ann) is typing.Annotated else ann


FLOAT_KEYS = sorted(_float_keys())


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_refuses_inf_and_nan(key, value):
    """Issue 26, item 4: train.lr=inf was accepted (step 1 wrecked the weights and the run reported success)."""
    default = load_config(None, []).model_dump()
    for part in key.split("."):
        default = default[part]
    text = f"[{value}, {value}]" if isinstance(default, (tuple, list)) else value
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={text}"])
    assert key in str(err.value) and "\n" not in str(err.value)


def test_float_keys_are_found():
    assert {"train.lr", "train.betas", "engine.temperature", "engine.timeout_s", "collapse.min_peak"} <= set(FLOAT_KEYS)


def test_qwen3_gpu_config_uses_the_gpu_trainer_settings():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "qwen3_gpu.yaml", [])
    t = cfg.train
    assert (t.dtype, t.tf32, t.activation_checkpointing, t.logprob_chunk_tokens) == ("bf16", True, True, "auto")
    assert (t.microbatch_order, t.compile, cfg.weights.transport) == ("by_length", False, "dist")
    default = load_config(None, []).train  # the CPU testbed keeps its exact fp32 path
    assert (default.dtype, default.activation_checkpointing, default.logprob_chunk_tokens) == ("fp32", False, 0)
    assert (default.microbatch_order, default.compile) == ("shuffled", False)


@pytest.mark.parametrize("item,field", [("train.dtype=fp16", "train.dtype"),
                                        ("train.logprob_chunk_tokens=-1", "train.logprob_chunk_tokens")])
def test_bad_trainer_precision_or_memory_setting_names_the_field(item, field):
    from satrl.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        load_config(None, [item])
