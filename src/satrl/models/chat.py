"""A task's prompt as token ids: the one place prompts are encoded, through the tokenizer's chat template or not.

A task gives each prompt as a string or as chat messages (a tuple of ``{"role", "content"}`` dicts, the
conversational format TRL and verl take). :func:`encode_prompt` turns either into the ids every engine receives,
so the torch and vLLM engines, the run's evaluator, ``satrl eval`` and the context check see the same tokens:

- ``template`` off (``model.chat.template=false``, the default): ``tokenizer(prompt)["input_ids"]``, the tokenizer
  used as is (the character tokenizer prepends BOS). A prompt given as messages is refused: it needs a template.
- ``template`` on: a string prompt becomes one user message; ``system_prompt`` (if set) is put first unless the
  messages start with a system message of their own; the messages are rendered with
  ``tokenizer.apply_chat_template(..., tokenize=False, add_generation_prompt=...)`` and that text is encoded with
  ``add_special_tokens=False`` (the template writes its own special tokens: what ``apply_chat_template(...,
  tokenize=True)`` and TRL's ``maybe_apply_chat_template`` followed by its tokenization do). A tokenizer without a
  chat template is a one-line :class:`ChatTemplateError` naming ``model.chat.template``.

Nothing here imports torch or transformers: the tokenizer is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from satrl.types import Prompt, check_messages


class ChatTemplateError(ValueError):
    """A prompt that cannot be encoded with these settings (messages without a template, a tokenizer without a
    chat template): one line naming the ``model.chat`` key to change."""


@dataclass(frozen=True)
class ChatFormat:
    """How prompts are encoded: plain arguments of the ``model.chat`` config section (:class:`ChatConfig
    <satrl.models.config.ChatConfig>`)."""

    template: bool = False
    system_prompt: str | None = None
    add_generation_prompt: bool = True


PLAIN = ChatFormat()


def chat_messages(prompt: Prompt, fmt: ChatFormat) -> list[dict[str, str]]:
    """The messages a prompt is rendered from: a string as one user message, ``fmt.system_prompt`` first unless
    the messages open with a system message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in check_messages(prompt)]
    if fmt.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": fmt.system_prompt})
    return messages


def render_prompt(tokenizer: Any, prompt: Prompt, fmt: ChatFormat) -> str:
    """The prompt's text as the chat template renders it (``fmt.template`` must be on)."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatTemplateError(f"model.chat.template=true: the tokenizer of {name!r} has no chat template; use a "
                                "model whose tokenizer has one (docs/real-models.md) or set model.chat.template=false")  # fmt: skip
    return tokenizer.apply_chat_template(chat_messages(prompt, fmt), tokenize=False,
                                         add_generation_prompt=fmt.add_generation_prompt)  # fmt: skip


def encode_prompt(tokenizer: Any, prompt: Prompt, fmt: ChatFormat = PLAIN) -> list[int]:
    """The token ids of ``prompt`` under ``fmt`` (see the module docstring): what every engine is given."""
    if not fmt.template:
        if not isinstance(prompt, str):
            raise ChatTemplateError("the task gives its prompts as chat messages, which need the tokenizer's chat "
                                    "template: set model.chat.template=true")  # fmt: skip
        return list(tokenizer(prompt)["input_ids"])
    return list(tokenizer(render_prompt(tokenizer, prompt, fmt), add_special_tokens=False)["input_ids"])
