"""TrainerSettings and the ``train:`` section agree (issue 61): every option both hold has one name, a type the
settings accept for every value the config does, and one default; a run's settings copy each by name."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal, get_args, get_origin

import pytest
import torch

from satrl.training.config import TrainConfig
from satrl.training.settings import SHARED, TrainerSettings

# The settings' own options, not in train: (other sections, a flag standing for a train: choice, or what the run
# derives from its transport and engine: snapshot_cut).
ELSEWHERE = {"aggregation", "temperature", "r3", "decompose", "seed", "whole_batch_quantile", "recomputed_denominator",
             "snapshot_cut"}


def _members(tp: Any) -> set:
    """The plain types a value of annotation ``tp`` may have (Annotated stripped, a Literal as its values' types)."""
    if get_origin(tp) is Annotated:
        return _members(get_args(tp)[0])
    if get_origin(tp) is Literal:
        return {type(v) for v in get_args(tp)}
    if get_origin(tp) in (typing.Union, __import__("types").UnionType):
        return set().union(*(_members(a) for a in get_args(tp)))
    if get_origin(tp) is tuple:
        return {(tuple, *(frozenset(_members(a)) for a in get_args(tp)))}
    return {tp}


def test_every_option_is_shared_or_named_elsewhere():
    names = {f.name for f in dataclasses.fields(TrainerSettings)}
    assert set(SHARED) == names - ELSEWHERE
    assert ELSEWHERE.isdisjoint(TrainConfig.model_fields)  # a clash would need a rename, not a silent copy


@pytest.mark.parametrize("name", SHARED)
def test_shared_option_types_agree(name):
    mine = typing.get_type_hints(TrainerSettings)[name]
    theirs = _members(TrainConfig.model_fields[name].annotation)
    if mine is Any:
        return
    assert theirs <= _members(mine), f"{name}: train accepts {theirs}, the settings {_members(mine)}"
    literal = [a for a in [TrainConfig.model_fields[name].annotation] if get_origin(a) is Literal]
    for value in get_args(literal[0]) if literal else ():  # each config choice the settings accept
        TrainerSettings(lr=1e-3, **{name: value})


@pytest.mark.parametrize("name", [n for n in SHARED if n != "lr"])  # lr: required of a settings' author
def test_shared_option_defaults_agree(name):
    assert getattr(TrainerSettings(lr=1e-3), name) == getattr(TrainConfig(), name)


def test_flags_default_to_the_configs_choice():
    s, t = TrainerSettings(lr=1e-3), TrainConfig()
    assert s.whole_batch_quantile == (t.quantile_scope == "batch")
    assert s.recomputed_denominator == (t.denominator == "recomputed")


def test_from_config_copies_every_option():
    """Every shared option set away from its default in the config arrives as set (a field dropped or
    mis-copied would keep the default)."""
    changed = {"lr": 3e-3, "betas": (0.5, 0.6), "weight_decay": 0.1, "grad_clip": None, "microbatch_tokens": 77,
               "device": "cpu", "minibatches": 3, "ppo_epochs": 2, "adv_std_norm": False, "advantage": "rloo",
               "dtype": "bf16", "activation_checkpointing": True, "logprob_chunk_tokens": "auto",
               "lr_lag_scaling": "inverse", "microbatch_order": "by_length", "compile": True,
               "quantile_scope": "batch", "denominator": "recomputed"}  # fmt: skip
    assert set(SHARED) <= set(changed)
    train = TrainConfig(**changed)
    s = TrainerSettings.from_config(train, aggregation="seq-mean-token-sum", temperature=0.7, r3=True, decompose=True,
                                    seed=5)  # fmt: skip
    for name in SHARED:
        assert getattr(s, name) == getattr(train, name), name
    assert s.advantage.name == "rloo" and s.betas == (0.5, 0.6) and isinstance(s.betas, tuple)
    assert s.whole_batch_quantile and s.recomputed_denominator
    assert (s.aggregation, s.temperature, s.r3, s.decompose, s.seed) == ("seq-mean-token-sum", 0.7, True, True, 5)


def test_run_settings_are_the_configs():
    from satrl.config.run import RunConfig
    from satrl.launch.setup import trainer_settings

    cfg = RunConfig()
    s = trainer_settings(cfg)
    assert s == dataclasses.replace(TrainerSettings(lr=cfg.train.lr), temperature=cfg.engine.temperature,
                                    aggregation=cfg.objective.aggregation, seed=cfg.seed,
                                    decompose=cfg.diagnostics.decompose, r3=cfg.r3)  # fmt: skip
    assert isinstance(torch.device(s.device), torch.device)
