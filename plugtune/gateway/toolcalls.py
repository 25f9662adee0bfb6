"""Parse the Hermes/Qwen tool-call form ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string, a fresh call id)."""
        return {
            "id": "call_" + secrets.token_hex(12),
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    tool_calls: list[ToolCall]


def parse_reply(text: str) -> ParsedReply:
    """Split model text into content and tool calls.

    Text without ``<tool_call>`` is plain content. When it has one, every block must be closed and
    hold a JSON object with a string ``name`` and an object ``arguments`` (or none), and nothing
    but whitespace may follow the blocks; otherwise the whole text is returned as plain content
    (the caller answers with finish_reason "stop").
    """
    start = text.find(OPEN)
    if start < 0:
        return ParsedReply(text, [])
    calls: list[ToolCall] = []
    position = start
    for match in _BLOCK.finditer(text, start):
        if text[position : match.start()].strip():
            return ParsedReply(text, [])
        call = _parse_call(match.group(1))
        if call is None:
            return ParsedReply(text, [])
        calls.append(call)
        position = match.end()
    if not calls or text[position:].strip():
        return ParsedReply(text, [])
    content = text[:start].strip()
    return ParsedReply(content or None, calls)


def _parse_call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(data["name"], arguments)
