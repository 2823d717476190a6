"""Chat templates: a decoder's conversation rendered into its prompt text as transformers' ``apply_chat_template``
renders it, from the template and special tokens the artifact carries (kiln.records.task.ChatTemplate), so a
server renders chats with Jinja alone (no transformers).

The environment is transformers' (``transformers.utils.chat_template_utils``): a sandbox, ``trim_blocks`` and
``lstrip_blocks``, the loop-controls extension, a ``tojson`` that keeps non-ASCII text, and the ``raise_exception``
and ``strftime_now`` functions templates call. The rendered text holds the template's own special tokens, so it is
tokenized without adding more (transformers' ``apply_chat_template(tokenize=True)`` does the same).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from kiln.errors import UsageError
from kiln.records.task import ChatTemplate

# The special tokens a template may read by name, as transformers passes them (its special_tokens_map).
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def chat_template(tokenizer: Any) -> ChatTemplate | None:
    """The chat template of a transformers ``tokenizer`` and its special tokens' texts; None where it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # several named templates: the one transformers uses by default
        template = template.get("default")
    if not template:
        return None
    tokens = {name: str(value) for name in TOKEN_NAMES if (value := getattr(tokenizer, name, None)) is not None}
    return ChatTemplate(str(template), tokens)


def is_conversation(value: Any) -> bool:
    """Whether ``value`` is one conversation: a list of messages, each a mapping with a role."""
    return isinstance(value, Sequence) and not isinstance(value, str) and bool(value) and all(
        isinstance(m, Mapping) and "role" in m for m in value)


def prompt_texts(chat: ChatTemplate | None, prompts: Sequence[Any]) -> tuple[list[str], bool]:
    """Each of ``prompts`` as prompt text, and whether they are rendered conversations (tokenized without adding
    special tokens: the template wrote its own). All prompts, or all conversations: a mix is refused."""
    chats = [is_conversation(p) for p in prompts]
    if not any(chats):
        return list(prompts), False
    if not all(chats):
        raise UsageError("prompts: give prompt strings or conversations (lists of {role, content} messages), not "
                         "both in one call")
    if chat is None:
        raise UsageError("messages: this model has no chat template (its tokenizer defines none), so kiln cannot "
                         "tell how it reads a conversation; send prompt text (generate(), /v1/completions), or add "
                         "the template (chat_template.jinja beside the model) and build the artifact again")
    return [render(chat, p) for p in prompts], True


def render(chat: ChatTemplate, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
    """``messages`` (each a role and its content) as the model's prompt text, opening the assistant's turn."""
    try:
        return _compiled(chat.template).render(messages=[dict(m) for m in messages],
                                               add_generation_prompt=add_generation_prompt, **chat.tokens)
    except Exception as err:  # Jinja's errors, and the template's own raise_exception, name what it refused
        raise UsageError(f"messages: the model's chat template refused them: {type(err).__name__}: {err}") from err


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)
