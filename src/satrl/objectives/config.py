"""The ``objective:`` section of the run config: a preset, its four typed components (:class:`ObjectiveSpec`)
and the loss aggregation (:data:`satrl.objectives.AGGREGATIONS`), checked against its registry when the config
loads."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from satrl.objectives.components import AGGREGATIONS
from satrl.objectives.presets import SLOTS, ObjectiveSpec

AggregationName = Annotated[str, AfterValidator(AGGREGATIONS.check)]  # a name in the registry

# Objective hyperparameters meet the loss in float32 (or bf16, the same range): larger magnitudes do not convert.
FLOAT32_MAX = 3.4028234663852886e38


class ObjectiveConfig(ObjectiveSpec):
    """The objective: a preset, its four typed components with every hyperparameter (saved resolved), and the
    loss aggregation. Flat keys (``objective.alpha=0.8``, ``objective.kl_coef=0``) go to the component that
    declares them; nested ones (``objective.trust_region.alpha=0.8``) name it. Every number of a component is
    at most 3.4e38 in magnitude (float32's range, in which the loss is computed: ``trust_region.eps_high=1e308``
    failed at the first step)."""

    aggregation: AggregationName = Field("token-mean", description="Loss aggregation mode (satrl.objectives.AGGREGATIONS).")

    @model_validator(mode="after")
    def _in_float32(self) -> ObjectiveConfig:
        for slot in SLOTS:
            params = getattr(self, slot)
            for key, value in params:
                if isinstance(value, float) and abs(value) > FLOAT32_MAX:
                    raise ValueError(f"{slot}.{key}={value:g} is beyond float32's range (|x| <= 3.4e38), in which "
                                     "the loss is computed")  # fmt: skip
        return self
