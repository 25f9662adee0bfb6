"""Rendering OpenAI messages with the model's own chat template, and comparing conversations."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar


class TemplateError(ValueError):
    """The chat template could not render these messages (a bad request, not a crash)."""


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as chat templates expect it: text content, parsed tool-call arguments."""
    role = "system" if message["role"] == "developer" else message["role"]
    out: dict[str, Any] = {"role": role, "content": text_of(message.get("content"))}
    if role == "assistant" and message.get("content") is None:
        out["content"] = None
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": arguments_of(c["function"])},
            }
            for c in calls
        ]
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def text_of(content: Any) -> str:
    """Content as one string: a string, ``None`` (empty) or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def arguments_of(function: dict[str, Any]) -> Any:
    """Tool-call arguments parsed from their JSON string (kept as given when they are not JSON)."""
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two messages the same turn of a conversation (ids and formatting aside)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return (message["role"], message.get("content") or "", calls)


def is_extension(previous: list[dict[str, Any]], current: list[dict[str, Any]]) -> bool:
    """Whether ``current`` is ``previous`` followed by at least one more message."""
    if len(current) <= len(previous):
        return False
    return all(message_key(a) == message_key(b) for a, b in zip(previous, current, strict=False))


#: Renders and encodings remembered per renderer: the rollouts of a GRPO group send the same prompt.
CACHE_SIZE = 4096


@dataclass
class ChatRenderer:
    """The tokenizer's chat template and encoder, as the gateway uses them.

    Both are pure functions of their input, so recent results are reused (a template that reads
    the clock, such as one calling ``strftime_now``, is always rendered afresh).
    """

    tokenizer: Any
    _rendered: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _encoded: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError("the tokenizer has no chat_template; the policy gateway needs one")
        self._reuse_renders = "strftime" not in str(template)

    @property
    def eos_text(self) -> str:
        return str(self.tokenizer.eos_token or "")

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        if not self._reuse_renders:
            return self._render(messages, tools, add_generation_prompt)
        key = json.dumps([messages, tools or None, add_generation_prompt], sort_keys=True, default=str)
        text = self._rendered.get(key)
        if text is None:
            text = _remember(self._rendered, key, self._render(messages, tools, add_generation_prompt))
        return text

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as exc:  # jinja raises many kinds; all mean "cannot render this"
            raise TemplateError(f"the chat template cannot render these messages: {exc}") from exc
        return str(text)

    def encode(self, text: str) -> list[int]:
        ids = self._encoded.get(text)
        if ids is None:
            encoded = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = _remember(self._encoded, text, list(encoded))
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def bridge(self, rendered_previous: str, ended_with_eos: bool) -> str:
        """Template text that follows the last generated token before the next message.

        The previous conversation rendered without a generation prompt ends with the template's
        close of the assistant turn (ChatML: ``<|im_end|>\\n``). A reply that ended on the
        end-of-sequence token already holds the close; one cut short by a budget or stop string
        does not.
        """
        eos = self.eos_text
        at = rendered_previous.rfind(eos) if eos else -1
        if at < 0:
            return ""
        tail = rendered_previous[at + len(eos) :]
        return tail if ended_with_eos else eos + tail


T = TypeVar("T")


def _remember(cache: dict[str, T], key: str, value: T) -> T:
    if len(cache) >= CACHE_SIZE:
        cache.clear()  # a new phase of the job (new prompts): start over rather than track recency
    cache[key] = value
    return value
