"""What every component's config section is built on: :class:`ConfigError`, the strict pydantic base
:class:`Section` and the device names.

A leaf (it imports nothing of satrl): each component declares its own section next to its code
(``satrl/engines/config.py``, ``satrl/tasks/config.py``, ...) on this base, and a field naming a choice is
checked against that choice's registry, imported plainly (``Annotated[str, AfterValidator(ENGINES.check)]``).
:mod:`satrl.config.run` assembles the run config from them, and :mod:`satrl.config` is its public face
(docs/design.md, "Layers and the rules between them").
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A bad config key or value. The message is one line, naming the field and the allowed values."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # one line, whatever a key or value held


def show(part: object) -> str:
    """A key part as typed, or quoted (repr) when it holds spaces or unprintable characters."""
    text = str(part)
    return text if text and text.isprintable() and " " not in text else repr(text)


class Section(BaseModel):
    """A config section: unknown keys refused, every assignment validated, no inf or NaN."""

    # allow_inf_nan=False: no setting means anything at inf or NaN (train.lr=inf wrecked the weights at step 1 and
    # the run reported success); a bound such as gt=0 alone lets inf through.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 where an int is expected (seed=true ran seed 1): refused, naming the value
        if isinstance(value, bool) and info.field_name is not None and _wants_int(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"got {value!r}; expected an integer, not a boolean")
        return value


def _wants_int(annotation: Any) -> bool:
    """Whether a field is an integer, or an integer or None (a boolean is then no value for it)."""
    if annotation is int:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return int in args and bool not in args
    return False


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases: a config has no use for them, and a few nested aliases
    (billion laughs) expand to gigabytes when loaded (issue 60: memory grew ~70 MB/s under --print-config)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AliasRefused(event.start_mark.line + 1)
        return super().compose_node(parent, index)


class _AliasRefused(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def load_yaml(text: str, where: str | Path) -> Any:
    """``yaml.safe_load`` of a user's config text (a file, a grid, an override's value), refusing YAML anchors
    and aliases (``&name``, ``*name``) with a :class:`ConfigError` naming ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)
    except _AliasRefused as refused:
        raise ConfigError(f"{where}:{refused.line}: YAML anchors and aliases (&name, *name) are not accepted in a "
                          "config; write the values out") from None  # fmt: skip


# yaml.safe_load's loader, with libyaml's parser where PyYAML has it: the same documents read the same, about ten
# times faster (a report or a grid's start reads every run's config.yaml; the pure-Python parser was a fifth of
# a report's time)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_saved(text: str) -> Any:
    """``yaml.safe_load`` of a file satrl wrote itself (a run's ``config.yaml``), through :data:`SAFE_LOADER`."""
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)


def dump_saved(data: Any) -> str:
    """``yaml.safe_dump(data, sort_keys=False)`` through libyaml's emitter where PyYAML has it: a run's
    ``config.yaml`` as it is saved, and as ``benchmarks/migrate_results.py`` rewrites it (the same bytes as the
    pure-Python emitter's on the 827 committed ones, in a quarter of the time)."""
    return yaml.dump(data, Dumper=SAFE_DUMPER, sort_keys=False)


DEVICES = "cpu, cuda or cuda:N"
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device_name(device: str) -> str:
    """A device's name must be ``cpu``, ``cuda`` or ``cuda:N`` (``meta`` holds no data; torch's other kinds are
    not supported). Whether this machine has it is :func:`check_device_here`'s question, asked where it runs."""
    if not (isinstance(device, str) and _DEVICE.fullmatch(device)):
        raise ValueError(f"got {device!r}; expected {DEVICES}")
    return device


def check_device_here(device: str, key: str) -> None:
    """:class:`ConfigError` naming ``key`` unless ``device`` (a name :func:`check_device_name` took) exists on this
    machine: asked by the command about to use it (a saved config stays loadable on a machine without CUDA)."""
    try:
        check_device_name(device)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
    if device == "cpu":
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= have:
        there = "no CUDA device" if have == 0 else f"{have} CUDA device{'s' if have > 1 else ''} (cuda:0-{have - 1})"
        raise ConfigError(f"{key}={device}: this machine has {there}; use {key}=cpu"
                          + ("" if have == 0 else " or one it has"))  # fmt: skip


Device = Annotated[str, AfterValidator(check_device_name)]
