"""The ``task:`` section of the run config: a name in :data:`satrl.tasks.TASKS` (or ``gym:<dataset>``) and its
arguments, checked against the registry when the config loads."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from satrl.config_base import Section
from satrl.tasks import TASKS

TaskName = Annotated[str, AfterValidator(TASKS.check)]  # a name in the registry, the one list of valid names


class TaskConfig(Section):
    name: TaskName = Field("arithmetic", description="Task: a name in satrl.tasks.TASKS, or gym:<reasoning_gym dataset>.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the task.")
