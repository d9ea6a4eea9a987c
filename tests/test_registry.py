"""The one registry: registering, refusing duplicates, naming the valid choices; and the config asking it."""

import subprocess
import sys

import pytest

from satrl.config import ConfigError, load_config
from satrl.registry import Registry, UnknownChoice


def test_register_by_decorator_and_by_call():
    reg: Registry = Registry("widget")

    @reg.register("b")
    def build_b():
        return "B"

    assert reg.register("a", 1) == 1  # a call returns what it registered
    assert build_b() == "B"  # the decorator returns the function itself
    assert reg.get("b") is build_b and reg["a"] == 1
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert "a" in reg and "c" not in reg and 3 not in reg
    assert reg.check("a") == "a"


def test_duplicate_name_is_an_error():
    reg = Registry("widget", {"a": 1})
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    assert reg.get("a") == 1  # the first one stays
    with pytest.raises(ValueError, match="already registered"):
        Registry("widget", {"a": 1}).register("a")(lambda: None)


def test_unknown_name_names_every_valid_choice():
    reg = Registry("widget", {"zeta": 1, "alpha": 2}, hint=" or 'x:<anything>'")
    with pytest.raises(UnknownChoice) as err:
        reg.get("alpah")
    assert str(err.value) == "unknown widget 'alpah'; valid choices: ['alpha', 'zeta'] or 'x:<anything>'"
    assert isinstance(err.value, ValueError) and err.value.choices == ["alpha", "zeta"]
    with pytest.raises(UnknownChoice, match="valid choices"):
        reg.check(None)  # not even a string: the same one-line error
    assert reg.get("nope", "dflt") == "dflt"


def test_fallback_accepts_a_family_of_names():
    reg = Registry("task", {"a": 1}, fallback=lambda n: n.upper() if n.startswith("x:") else None)
    assert reg.get("x:foo") == "X:FOO" and "x:foo" in reg
    assert reg.names() == ["a"]  # a family is described by the hint, never listed
    with pytest.raises(UnknownChoice):
        reg.get("y:foo")


def test_make_builds_the_entry_and_meta_needs_make():
    reg = Registry("part", make=lambda name, fn, size=1: (name, fn, size))
    reg.register("p", size=3)(len)
    assert reg.get("p") == ("p", len, 3)
    with pytest.raises(TypeError, match="takes no metadata"):
        Registry("plain").register("p", size=3)


def test_replaced_restores_the_entry():
    reg = Registry("widget", {"a": 1})
    with reg.replaced("a", 2):
        assert reg.get("a") == 2
    assert reg.get("a") == 1
    with pytest.raises(UnknownChoice):
        with reg.replaced("b", 2):
            pass


def test_there_is_one_registry_class():
    import satrl.objectives.registry as objective_components
    from satrl.engines import ENGINES, NUMERICS
    from satrl.models import BUILTINS
    from satrl.models.tiny import KINDS
    from satrl.objectives import AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, PRESETS, RATIO_LEVELS
    from satrl.objectives.components import TRUST_REGIONS
    from satrl.objectives.sat import SAT_PROXIES
    from satrl.pipeline.engines_host.backends import BACKENDS
    from satrl.pipeline.schedules import SCHEDULES
    from satrl.tasks import TASKS
    from satrl.tasks.gym import EXTRACTORS
    from satrl.training.recipes import RECIPES

    assert objective_components.Registry is Registry
    for reg in (ENGINES, NUMERICS, BUILTINS, KINDS, AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, PRESETS, RATIO_LEVELS,
                TRUST_REGIONS, SAT_PROXIES, BACKENDS, SCHEDULES, TASKS, EXTRACTORS, RECIPES):  # fmt: skip
        assert type(reg) is Registry and reg.names(), reg


def test_sat_proxies_are_a_registry():
    from satrl.objectives import resolve_objective
    from satrl.objectives.sat import LAG_FREE_PROXIES, PROXIES, SAT_PROXIES

    assert PROXIES == tuple(SAT_PROXIES.names()) == ("log_ratio", "prob_diff", "version_age")
    assert LAG_FREE_PROXIES == ("log_ratio", "prob_diff")
    assert SAT_PROXIES.get("version_age").needs == {"lag"}
    with pytest.raises(ValueError, match=r"proxy: unknown SAT proxy 'nope'; valid choices: \['log_ratio', 'prob_diff', "):
        resolve_objective("sat_grpo", proxy="nope")


def _components():
    from satrl.objectives.presets import SLOTS

    return [(slot, comp) for slot, reg in SLOTS.items() for _, comp in reg.items()]


def test_every_component_declares_typed_defaults_that_validate():
    from satrl.objectives import Params

    for slot, comp in _components():
        assert isinstance(comp.defaults, dict) and "name" not in comp.defaults, (slot, comp.name)
        typed = comp.validate(comp.defaults)
        assert isinstance(typed, Params) and isinstance(typed, comp.params) and typed.name == comp.name
        assert typed == comp.validate({}) and typed.kwargs() == comp.defaults  # defaults fill what is not given
        assert comp.params.model_validate(typed.model_dump()) == typed  # what is saved loads back the same


def test_component_validation_names_the_key_in_one_line():
    from satrl.objectives import CORRECTIONS, TRUST_REGIONS

    sat = TRUST_REGIONS.get("sat")
    typed = sat.validate({"alpha": 0.8, "exponent": 1})
    assert (typed.alpha, typed.exponent, typed.eps_high) == (0.8, 1.0, 0.2) and isinstance(typed.exponent, float)
    for values, needle in (
        ({"alpha": 1.5}, r"^sat: alpha: .*less than or equal to 1$"),
        ({"exponent": 0}, r"^sat: exponent: .*greater than 0$"),
        ({"eps_low": "wide"}, r"^sat: eps_low: "),
        ({"alpha": float("nan")}, r"^sat: alpha: "),  # no NaN/inf: they would pass every range check
        ({"proxy": "entropy"}, r"^sat: proxy: unknown SAT proxy 'entropy'; valid choices: \['log_ratio'"),
        ({"dual_clip": 0.5}, r"^sat: dual_clip: .*greater than 1$"),
    ):
        with pytest.raises(ValueError, match=needle) as err:
            sat.validate(values)
        assert "\n" not in str(err.value), values
    with pytest.raises(ValueError, match=r"^tis: correction_level: got 'batch'; .*'token' or 'sequence'"):
        CORRECTIONS.get("tis").validate({"correction_level": "batch"})


def test_component_unknown_key_lists_the_valid_keys():
    from satrl.objectives import KL_ESTIMATORS, TRUST_REGIONS

    with pytest.raises(ValueError) as err:
        TRUST_REGIONS.get("ppo").validate({"alpha": 0.9})  # a SAT key on PPO
    assert str(err.value) == "ppo: alpha: unknown key; valid keys: ['dual_clip', 'eps_high', 'eps_low']"
    with pytest.raises(ValueError, match=r"^k3: kl_coef: unknown key \(did you mean 'coef'\?\); valid keys: \['coef'\]$"):
        KL_ESTIMATORS.get("k3").validate({"kl_coef": 0.0})  # the flat name is resolve_objective's, not the model's
    with pytest.raises(ValueError, match=r"^none: coef: unknown key; valid keys: \[\]$"):
        KL_ESTIMATORS.get("none").validate({"coef": 0.0})


def test_typed_params_are_frozen():
    from satrl.objectives import resolve_objective

    spec = resolve_objective("sat_grpo")
    with pytest.raises(ValueError):
        spec.trust_region.alpha = 0.5  # a spec cannot drift from what the run saved
    with pytest.raises(ValueError):
        spec.name = "grpo"


def _registries():
    from satrl.engines import ENGINES, NUMERICS
    from satrl.objectives import AGGREGATIONS, PRESETS
    from satrl.pipeline.engines_host.backends import BACKENDS
    from satrl.pipeline.schedules import SCHEDULES
    from satrl.tasks import TASKS

    return {
        "engine.name": ENGINES,
        "eval.engine": ENGINES,
        "engine.numerics": NUMERICS,
        "task.name": TASKS,
        "backend": BACKENDS,
        "lag.schedule": SCHEDULES,
        "objective.name": PRESETS,
        "objective.aggregation": AGGREGATIONS,
    }


@pytest.mark.parametrize("field", list(_registries()))
def test_config_names_the_valid_choices_of_each_registry_field(field):
    reg = _registries()[field]
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{field}=nope"])
    msg = str(err.value)
    assert msg.startswith(f"invalid config: {field}: unknown {reg.kind} 'nope'; valid choices: {reg.names()}"), msg
    assert "\n" not in msg and "Value error" not in msg
    for name in reg.names():  # and every registered name is valid there
        if field == "task.name" and name != "arithmetic":
            continue  # the other tasks need their arguments (a path) or an extra to run, not to validate
        assert load_config(None, [f"{field}={name}"]) is not None


def test_a_registered_engine_is_valid_in_the_config_at_once():
    code = ("from satrl.engines import ENGINES\n"
            "ENGINES.register('mine', lambda **kw: None)\n"
            "from satrl.config import load_config\n"
            "print(load_config(None, ['engine.name=mine', 'eval.engine=mine']).engine.name)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "mine", out.stderr
