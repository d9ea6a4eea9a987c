"""The ``weights:`` section of the run config: how each version's weights reach the engine side, a name in
:data:`satrl.weights.transports.TRANSPORTS` checked when the config loads. Which backends carry which transport,
the backends declare (the run config checks it: :mod:`satrl.config.run`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from satrl.config_base import Section
from satrl.weights.transports import TRANSPORTS

TransportName = Annotated[str, AfterValidator(TRANSPORTS.check)]  # a name in the registry


class WeightsConfig(Section):
    """How each version's weights reach the engine side (docs/design.md, "Weights travel once per version").
    Either way every version travels once and the engine side holds exactly the versions pending batches need."""

    transport: TransportName = Field(
        "inproc", description="A name in satrl.weights.transports.TRANSPORTS. inproc: a call (sequential), one "
        "pickled state dict per version on the local backend's queue, Ray's object store; dist: backend=local only, "
        "a 2-process torch.distributed group (gloo) between the trainer and the engine process, each version "
        "broadcast once as buckets in the engine's dtype; vllm: backend=local and an engine with its own weight "
        "transfer (engine.name=vllm) only, the same broadcast received and loaded by vLLM's own weight-transfer API "
        "inside vLLM's workers (the engine holds one version).",
    )  # fmt: skip
    bucket_mb: int = Field(256, ge=1, le=2**20, description="dist and vllm: the most MiB per broadcast bucket (a "
                           "larger single tensor gets a bucket of its own).")  # fmt: skip
