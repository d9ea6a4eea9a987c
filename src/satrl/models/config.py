"""The ``model:`` section of the run config: which policy to train (docs/design.md, "Layers and the rules between
them": each component owns its section; :mod:`satrl.pipeline.run_config` assembles them). The name is checked
when the policy loads (:func:`satrl.models.loading.resolve_policy_path`), since it may also be a path."""

from __future__ import annotations

from pydantic import Field

from satrl.config_base import Section


class ModelConfig(Section):
    name: str = Field("tiny-arith", description="Built-in policy (tiny-arith, tiny-arith-moe) if `path` is unset.")
    path: str | None = Field(None, description="Local Hugging Face causal-LM directory; overrides `name`.")

    @property
    def source(self) -> str:
        return self.path or self.name
