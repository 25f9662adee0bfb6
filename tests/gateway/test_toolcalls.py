from __future__ import annotations

import json

from plugtune.gateway import parse_reply


def test_plain_text_is_content() -> None:
    parsed = parse_reply("12")
    assert parsed.content == "12" and parsed.tool_calls == []


def test_one_hermes_tool_call_is_parsed() -> None:
    parsed = parse_reply('<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
    assert parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 3, "b": 4})]
    entry = parsed.tool_calls[0].to_openai()
    assert entry["type"] == "function" and entry["id"].startswith("call_")
    assert json.loads(entry["function"]["arguments"]) == {"a": 3, "b": 4}


def test_text_before_calls_is_content_and_several_calls_are_kept_in_order() -> None:
    text = (
        "Let me add.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n'
        '{"name": "mul", "arguments": "{\\"b\\": 2}"}\n</tool_call>\n'
    )
    parsed = parse_reply(text)
    assert parsed.content == "Let me add."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 1}), ("mul", {"b": 2})]


def test_malformed_calls_come_back_as_plain_text() -> None:
    for text in [
        '<tool_call>\n{"name": "add", "arguments": {"a": 3\n</tool_call>',  # bad JSON
        '<tool_call>\n{"name": "add", "arguments": {"a": 3}}',  # never closed
        '<tool_call>\n{"arguments": {"a": 3}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n["add"]\n</tool_call>',  # not an object
        '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call> and then some words',
    ]:
        parsed = parse_reply(text)
        assert parsed.content == text and parsed.tool_calls == [], text
