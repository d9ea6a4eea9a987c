"""The ``model:`` section of the run config: which policy to train and how its prompts are encoded (docs/design.md,
"Layers and the rules between them": each component owns its section; :mod:`satrl.config.run` assembles
them). The name is checked when the policy loads (:func:`satrl.models.loading.resolve_policy_path`), since it may
also be a path; ``model.chat`` becomes :class:`satrl.models.chat.ChatFormat` at the edge."""

from __future__ import annotations

from pydantic import Field, model_validator

from satrl.config_base import Section
from satrl.models.chat import ChatFormat  # light: no torch, no transformers


class ChatConfig(Section):
    """``model.chat``: whether prompts go through the tokenizer's chat template (docs/real-models.md)."""

    template: bool = Field(
        False, description="Render every prompt with the tokenizer's chat template (a string prompt as one user "
        "message); a task that gives its prompts as chat messages needs it. false: tokenizer(prompt) as is.",
    )  # fmt: skip
    system_prompt: str | None = Field(
        None, description="System message put first in every rendered prompt (not where the task's messages open "
        "with their own); null: none, or the template's own default. Needs template=true.",
    )  # fmt: skip
    add_generation_prompt: bool = Field(
        True, description="End the rendered prompt with the template's assistant header, so the policy answers as "
        "the assistant (apply_chat_template's add_generation_prompt).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _system_needs_template(self) -> ChatConfig:
        if self.system_prompt is not None and not self.template:
            raise ValueError("system_prompt is set but template=false, so no prompt would "
                             "carry it; set model.chat.template=true or drop the system prompt")  # fmt: skip
        return self


class ModelConfig(Section):
    name: str = Field("tiny-arith", description="Built-in policy (tiny-arith, tiny-arith-moe) if `path` is unset.")
    path: str | None = Field(None, description="Local Hugging Face causal-LM directory; overrides `name`.")
    chat: ChatConfig = Field(default_factory=ChatConfig, description="How prompts are encoded: the chat template.")

    @property
    def source(self) -> str:
        return self.path or self.name

    def chat_format(self) -> ChatFormat:
        """``model.chat`` as the plain :class:`~satrl.models.chat.ChatFormat` the engine side and evaluators take."""
        return ChatFormat(**self.chat.model_dump())
