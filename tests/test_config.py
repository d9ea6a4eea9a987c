"""Config: overrides, validation, and the CLI's exit code 2 with a one-line message."""

import subprocess
import sys

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

    from satrl.objectives import resolve_objective

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "qwen3_gpu.yaml", [])
    spec = resolve_objective(cfg.objective.name, **cfg.objective.overrides)
    assert spec.ratio == "token" and spec.trust_region == "sat" and spec.kl == "k3"
    assert {k: spec.params[k] for k in ("eps_low", "eps_high", "alpha", "exponent", "kl_coef")} == {
        "eps_low": 0.2, "eps_high": 0.2, "alpha": 0.9, "exponent": 2.0, "kl_coef": 1e-3,
    }  # fmt: skip
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


def test_qwen3_gpu_config_uses_the_gpu_trainer_settings():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "qwen3_gpu.yaml", [])
    t = cfg.train
    assert (t.dtype, t.tf32, t.activation_checkpointing, t.logprob_chunk_tokens) == ("bf16", True, True, 2048)
    default = load_config(None, []).train  # the CPU testbed keeps its exact fp32 path
    assert (default.dtype, default.activation_checkpointing, default.logprob_chunk_tokens) == ("fp32", False, 0)


@pytest.mark.parametrize("item,field", [("train.dtype=fp16", "train.dtype"),
                                        ("train.logprob_chunk_tokens=-1", "train.logprob_chunk_tokens")])
def test_bad_trainer_precision_or_memory_setting_names_the_field(item, field):
    from satrl.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        load_config(None, [item])
