"""What every component's config section is built on: :class:`ConfigError`, the strict pydantic base
:class:`Section` and the device names.

A leaf (it imports nothing of satrl): each component declares its own section next to its code
(``satrl/engines/config.py``, ``satrl/tasks/config.py``, ...) on this base, and a field naming a choice is
checked against that choice's registry, imported plainly (``Annotated[str, AfterValidator(ENGINES.check)]``).
:mod:`satrl.pipeline.run_config` assembles the run config from them, and :mod:`satrl.config` is its public face
(docs/design.md, "Layers and the rules between them").
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


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
