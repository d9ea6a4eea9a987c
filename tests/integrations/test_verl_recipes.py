"""verl's entry points as installed, run as docs/integrations.md prints them, up to satrl's config-time decision.

Each command runs in a process of its own (forked from one that imported verl once: verl_main_runner.py), from
a scratch working directory (no chdir into verl's source tree), through verl's own Hydra ``main``: Hydra composes the installed verl's YAML from the command line, and the
entry point's first call on the driver (``auto_set_device``) runs satrl's check. ``ray.init`` is replaced
by an error and ``verl.trainer.main_ppo.run_ppo`` by what verl's TaskRunner does first (``OmegaConf.resolve``),
so no cluster starts: an accepted command prints the ``sat_mu`` the resolver chose, a refused one exits
with satrl's line as the last line of its stderr, before Ray.

Also here: the ``verl`` extra brings what verl's v1 and legacy trainers and both recipes import, and a
forgotten ``_target_`` override is explained before verl's own ``TypeError``. Like the other verl tests,
these skip without verl and never skip under ``SATRL_REQUIRE_VERL=1`` (``make test-verl``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from verl_main_runner import VerlMain

from run_helpers import Extra

with Extra("verl") as verl_extra:
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from satrl.integrations import _verl_mu
    VERL_ROOT = Path(verl.__file__).parent
VERL_MISSING = verl_extra.missing

pytestmark = pytest.mark.skipif(VERL_MISSING is not None, reason=str(VERL_MISSING))

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "integrations.md"
# The doc block these tests run: the fenced block right after a doc-test marker naming this file.
MARKER = re.compile(r"<!-- doc-test: check [^\n]*test_verl_recipes\.py[^\n]* -->\n```bash\n(?P<body>.*?)^```",
                    re.M | re.S)
RECIPE_MODULES = {"one_step_off": "verl.experimental.one_step_off_policy.main_ppo",
                  "fully_async": "verl.experimental.fully_async_policy.fully_async_main"}
BYPASS_OFF = "algorithm.rollout_correction.bypass_mode=false"
SAT_MU = "+actor_rollout_ref.actor.policy_loss.sat_mu=${satrl_mu:}"


@pytest.fixture(autouse=True)
def _no_reprint():
    yield
    _verl_mu._refusals.clear()  # refusals tested in this process are not reprinted when pytest exits


def doc_commands() -> dict[str, list[str]]:
    """The recipe commands docs/integrations.md prints, as argv after ``python -m``, keyed by recipe."""
    m = MARKER.search(DOC.read_text())
    assert m, f"{DOC}: no bash block after a doc-test marker naming test_verl_recipes.py"
    out = {}
    for line in m["body"].replace("\\\n", " ").splitlines():
        words = [w for w in shlex.split(line.split(" #")[0]) if w != "..."]
        if not words:
            continue
        assert words[:2] == ["python", "-m"], f"{DOC}: not a `python -m` command: {line}"
        recipe = next(k for k, v in RECIPE_MODULES.items() if v == words[2])
        out[recipe] = words[2:]
    assert set(out) == set(RECIPE_MODULES), f"{DOC}: the block must print both recipes, found {sorted(out)}"
    return out


# What the verl extra must make importable (verl's v1 and legacy trainers, both recipes): the server imports them
# once, so each command pays none of it (test_the_verl_extra_brings_what_verls_trainers_and_recipes_import).
PRELOAD = ["verl.trainer.ppo.v1", "verl.trainer.main_ppo_v0", *RECIPE_MODULES.values()]


@pytest.fixture(scope="module")
def run():
    """``run(argv, cwd)``: ``python -m *argv`` as verl's Hydra main with no cluster, each command in a process
    of its own forked from one that imported verl once (verl_main_runner.py)."""
    server = VerlMain(PRELOAD)
    yield server
    server.close()


def accepted(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("SATRL_ACCEPTED ")]
    assert len(lines) == 1, out.stdout[-2000:]
    return json.loads(lines[0].split(" ", 1)[1])


def refused(out: subprocess.CompletedProcess) -> str:
    """satrl's refusal line: the last line of stderr, before Ray started."""
    assert out.returncode != 0 and "SATRL_ACCEPTED" not in out.stdout, out.stdout[-2000:]
    assert "ray.init reached" not in out.stderr, out.stderr[-3000:]
    last = [line for line in out.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("satrl: "), out.stderr[-3000:]
    return last


@pytest.mark.parametrize("recipe", sorted(RECIPE_MODULES))
def test_recipe_command_as_the_docs_print_it_is_accepted_in_decoupled_mode(run, tmp_path, recipe):
    argv = doc_commands()[recipe]
    assert BYPASS_OFF in argv and SAT_MU in argv
    assert accepted(run(argv, tmp_path)) == {"sat_mu": "old_policy"}


@pytest.mark.parametrize("recipe,drop", [("one_step_off", (BYPASS_OFF,)), ("fully_async", (BYPASS_OFF,)),
                                         ("one_step_off", (BYPASS_OFF, SAT_MU))])
def test_recipe_in_bypass_mode_is_refused_before_ray_with_the_recipe_fix(run, tmp_path, recipe, drop):
    """The recipes' default, bypass mode, with or without sat_mu declared: refused on the driver, with the
    fix for a recipe (verl's v1 trainer; trainer.use_v1 means nothing to a recipe)."""
    line = refused(run([a for a in doc_commands()[recipe] if a not in drop], tmp_path))
    assert f"in the {recipe} trainer" in line and "trainer.v1.trainer_mode=separate_async" in line
    assert "set trainer.use_v1=true" not in line and "bypass_mode=false" in line


def test_legacy_trainer_in_bypass_mode_is_refused_before_ray_with_the_legacy_fix(run, tmp_path):
    argv = [a for a in doc_commands()["one_step_off"] if a != BYPASS_OFF and not a.startswith("hydra.")]
    argv = ["verl.trainer.main_ppo", *argv[1:], "trainer.use_v1=false", "algorithm.rollout_correction.bypass_mode=true"]
    line = refused(run(argv, tmp_path))
    assert "in the legacy trainer" in line and "set trainer.use_v1=true" in line


# A refusal's way out as printed: `python -m MODULE OVERRIDES` (the recipes') or `set OVERRIDES` (the legacy
# trainer's), each override a hydra `key=value`, up to the first word that is not one.
PRINTED = {"recipe": re.compile(r"python -m (?P<module>[\w.]+)(?P<overrides>(?: [\w.+]+=[^\s(),]+)+)"),
           "legacy": re.compile(r"(?P<module>)set(?P<overrides>(?: [\w.+]+=[^\s(),]+)+)")}
SAT_FLAG_PREFIXES = ("actor_rollout_ref.actor.policy_loss.", "+actor_rollout_ref.actor.policy_loss.")
# The "..." of a main_ppo command: what a real one sets besides SAT's flags and verl's validate_config (run in
# main_ppo's main before Ray) needs: an advantage estimator without a critic, micro-batch sizes, an engine.
USER_FLAGS = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=vllm"]


def printed_way_out(line: str, kind: str) -> tuple[str, list[str]]:
    """(module, overrides) of the way out ``line`` prints for ``kind``, read off the line as a user would copy it."""
    m = PRINTED[kind].search(line)
    assert m, f"no `{kind}` way out printed in: {line}"
    return m["module"], m["overrides"].split()


def compose_main_ppo(overrides: list[str]):
    """verl's own ``ppo_trainer`` YAML (the one ``python -m verl.trainer.main_ppo`` composes), with ``overrides``."""
    with initialize_config_dir(config_dir=str(VERL_ROOT / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def assert_engine_mu(cfg) -> None:
    """verl's config, as verl's code reads it, keeps SAT's mu the rollout engine's log-probs: bypass mode on (the
    v1 trainer copies rollout_log_probs into old_log_probs) and the engine asked for those log-probs."""
    from verl.workers.config import RolloutConfig

    assert cfg.trainer.use_v1 is True  # the v1 trainer, which keeps loss_mode in bypass mode
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    OmegaConf.resolve(cfg)  # as verl's TaskRunner does on the driver, before a worker builds its RolloutConfig
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig)
    assert rollout.calculate_log_probs is True  # the dataclass verl's rollout workers build from it


@pytest.mark.parametrize("recipe", sorted(RECIPE_MODULES))
def test_recipe_refusals_first_way_out_as_printed_keeps_mu_the_engines(run, tmp_path, recipe):
    """The recipe refusal's first way out, copied off the printed line (verl's v1 trainer, separate_async) with the
    docs' SAT flags: verl's ppo_trainer YAML composes to bypass mode with calculate_log_probs, and verl's own
    main_ppo accepts it with sat_mu resolved to ``rollout``. Without the printed bypass override the same command
    runs in verl's default decoupled mode, where SAT gates on pi_old: the trap the advice closes."""
    line = refused(run([a for a in doc_commands()[recipe] if a != BYPASS_OFF], tmp_path))
    module, overrides = printed_way_out(line, "recipe")
    assert module == "verl.trainer.main_ppo" and "trainer.v1.trainer_mode=separate_async" in overrides
    sat = [*(a for a in doc_commands()[recipe] if a.startswith(SAT_FLAG_PREFIXES)), *USER_FLAGS]
    cfg = compose_main_ppo([*overrides, *sat])
    assert cfg.trainer.v1.trainer_mode == "separate_async"
    assert_engine_mu(cfg)
    assert accepted(run([module, *overrides, *sat], tmp_path)) == {"sat_mu": "rollout"}
    if recipe == "fully_async":  # the same main_ppo command for both recipes: once is enough
        without = [o for o in overrides if not o.startswith(_verl_mu.BYPASS)]
        assert accepted(run([module, *without, *sat], tmp_path)) == {"sat_mu": "old_policy"}


def test_legacy_refusals_way_out_as_printed_keeps_mu_the_engines(run, tmp_path):
    """The legacy trainer's way out, appended as printed to the refused command, even one that had switched the
    engine's log-probs off: verl's config has bypass mode and calculate_log_probs on, and main_ppo accepts it
    with sat_mu ``rollout`` (run without the printed calculate_log_probs, the command is refused instead)."""
    argv = [a for a in doc_commands()["one_step_off"] if a != BYPASS_OFF and not a.startswith("hydra.")]
    argv = ["verl.trainer.main_ppo", *argv[1:], *USER_FLAGS, "trainer.use_v1=false",
            "algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false"]
    line = refused(run(argv, tmp_path))
    _, overrides = printed_way_out(line, "legacy")
    assert overrides[0] == "trainer.use_v1=true"
    assert_engine_mu(compose_main_ppo([*argv[1:], *overrides]))
    assert accepted(run([*argv, *overrides], tmp_path)) == {"sat_mu": "rollout"}
    partial = [o for o in overrides if not o.startswith(_verl_mu.CALC_LOG_PROBS)]
    assert _verl_mu.CALC_LOG_PROBS in refused(run([*argv, *partial], tmp_path))


def test_bypass_mode_without_calculate_log_probs_is_refused_before_ray(run, tmp_path):
    """verl's v1 trainer in bypass mode reads rollout_log_probs, which the engine produces only with
    calculate_log_probs: without it, satrl refuses on the driver with one line naming the key (decoupled
    mode, which does not need them, is accepted)."""
    sat = [*(a for a in doc_commands()["fully_async"] if a.startswith(SAT_FLAG_PREFIXES) and "sat_mu" not in a),
           *USER_FLAGS]
    off = "actor_rollout_ref.rollout.calculate_log_probs=false"
    line = refused(run(["verl.trainer.main_ppo", *sat, "algorithm.rollout_correction.bypass_mode=true", off,
                        "trainer.v1.trainer_mode=separate_async"], tmp_path))  # no sat_mu: the entry point's check
    assert line == (f"satrl: {_verl_mu.BYPASS}=true needs {_verl_mu.CALC_LOG_PROBS}=true (verl copies the "
                    "rollout engine's log-probs into old_log_probs, and the engine returns none without it): "
                    f"set {_verl_mu.CALC_LOG_PROBS}=true, or {_verl_mu.BYPASS}=false (SAT then gates on pi_old)")
    assert accepted(run(["verl.trainer.main_ppo", *sat, SAT_MU, BYPASS_OFF, off], tmp_path)) == {"sat_mu": "old_policy"}


def test_missing_target_override_is_explained_before_verls_type_error(run, tmp_path):
    """SAT's keys without the _target_ override: verl's PolicyLossConfig would reject them with a TypeError
    that names no fix; satrl's line names the override, on the driver, before verl builds the config."""
    argv = [a for a in doc_commands()["fully_async"] if "._target_=" not in a]
    line = refused(run([*argv, "+actor_rollout_ref.actor.policy_loss.sat_alpha=0.8"], tmp_path))
    assert "sat_alpha" in line and _verl_mu.TARGET_OVERRIDE in line


def compose_recipe(recipe: str, overrides: list[str]):
    sub = {"one_step_off": "experimental/one_step_off_policy/config",
           "fully_async": "experimental/fully_async_policy/config"}[recipe]
    with initialize_config_dir(config_dir=str(VERL_ROOT / sub), version_base=None):
        return compose(config_name=f"{recipe}_ppo_trainer", overrides=overrides)


def test_one_step_off_needs_the_searchpath_the_docs_print(tmp_path, monkeypatch):
    """verl's one_step_off YAML finds ppo_trainer through file://verl/trainer/config, relative to the working
    directory: from anywhere else Hydra cannot compose it, which is why the docs print the override."""
    monkeypatch.chdir(tmp_path)  # a working directory without verl's source tree, as a user's
    with pytest.raises(MissingConfigException, match="ppo_trainer"):
        compose_recipe("one_step_off", [])
    searchpath = [a for a in doc_commands()["one_step_off"] if a.startswith("hydra.searchpath=")]
    assert searchpath == ["hydra.searchpath=[pkg://verl.trainer.config]"]
    assert "actor_rollout_ref" in compose_recipe("one_step_off", searchpath)


def test_missing_target_reaches_verls_type_error_and_the_resolver_explains_it():
    """What satrl's check preempts (verl's own TypeError), and the same explanation from ${satrl_mu:}
    where only the resolver runs (a driver that skips the entry point's auto_set_device)."""
    cfg = compose_recipe("fully_async", ["actor_rollout_ref.actor.policy_loss.loss_mode=sat", BYPASS_OFF,
                                         "+actor_rollout_ref.actor.policy_loss.sat_alpha=0.8", SAT_MU,
                                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    with pytest.raises(Exception, match="unexpected keyword argument 'sat_alpha'"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.policy_loss)
    with pytest.raises(ValueError, match=re.escape(_verl_mu.TARGET_OVERRIDE)):
        _verl_mu.preflight(cfg)
    with pytest.raises(ValueError, match=re.escape(_verl_mu.TARGET_OVERRIDE)):
        OmegaConf.resolve(cfg)


def test_a_misspelled_sat_key_is_named_with_sat_keys():
    cfg = compose_recipe("fully_async", ["actor_rollout_ref.actor.policy_loss.loss_mode=sat", BYPASS_OFF,
                                         f"actor_rollout_ref.actor.policy_loss._target_={_verl_mu.SAT_TARGET}",
                                         "+actor_rollout_ref.actor.policy_loss.sat_alfa=0.8"])
    with pytest.raises(ValueError, match=r"policy_loss.sat_alfa is not one of SAT's keys \['sat_alpha', "):
        _verl_mu.preflight(cfg)


def test_preflight_leaves_other_configs_alone():
    """Not a SAT config (verl's own losses, an SFT-like config, no config): nothing to check."""
    cfg = compose_recipe("fully_async", [])  # bypass mode, loss_mode vanilla
    _verl_mu.preflight(cfg)
    _verl_mu.preflight(OmegaConf.create({"trainer": {"device": "cpu"}}))
    _verl_mu.preflight(None)


def test_the_entry_points_check_runs_in_verls_auto_set_device():
    """The hook: verl.utils.device.auto_set_device, the first call of main_ppo and both recipes' mains."""
    from verl.utils import device

    assert getattr(device.auto_set_device, "_satrl_guard", False)
    for module in ("trainer/main_ppo.py", *(f"{m.removeprefix('verl.').replace('.', '/')}.py"
                                            for m in RECIPE_MODULES.values())):
        source = (VERL_ROOT / module).read_text()
        assert "from verl.utils.device import auto_set_device" in source, module
        main = source[source.index("def main(config)"):]
        assert main.index("auto_set_device(config)") < main.index("run_ppo(config"), module


def test_the_verl_extra_brings_what_verls_trainers_and_recipes_import(run):
    """verl's v1 trainer (its default), the legacy trainer and both recipes import TransferQueue, cachetools,
    fastapi and uvicorn beyond verl's own requirements: the verl extra declares them, and they import (in the
    process that imported verl's main_ppo afresh, with the installed satrl's entry point: verl's registry holds
    SAT's losses from the plug-in, loaded with nothing imported by hand)."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in importlib.metadata.requires("satrl-async") or []]
    extra = {r.name.lower() for r in reqs if r.marker is not None and r.marker.evaluate({"extra": "verl"})}
    assert {"verl", "transferqueue", "cachetools", "fastapi", "uvicorn"} <= extra, extra
    failed = {m: why for m, why in run.imports.items() if m in PRELOAD and why != "ok"}
    if any("ModuleNotFoundError" in why for why in failed.values()) and os.environ.get("SATRL_REQUIRE_VERL") != "1":
        pytest.skip(f"this environment was not built with the verl extra ({failed})")
    assert not failed and set(run.imports) >= set(PRELOAD), failed
    assert run.imports["sat_loss_modules"] == "satrl.integrations.verl satrl.integrations.verl"
