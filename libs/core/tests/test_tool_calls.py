"""Hermes/Qwen `<tool_call>` blocks parsed out of a model's turn: calls in order, the text
around them, and a botched call reported (not raised)."""

from __future__ import annotations

import json

import pytest
from rlfleet_core.tool_calls import parse_hermes


def test_calls_and_the_text_around_them() -> None:
    text = (
        'First.<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> then '
        '<tool_call>\n[{"name": "b", "arguments": "{\\"y\\": 2}"}, {"name": "c"}]\n</tool_call>'
    )
    rest, calls = parse_hermes(text)
    assert rest == "First. then"
    assert [(c.name, json.loads(c.arguments_json), c.error) for c in calls] == [
        ("a", {"x": 1}, ""),
        ("b", {"y": 2}, ""),  # arguments as a JSON string (OpenAI's wire form)
        ("c", {}, ""),
    ]
    assert parse_hermes("no call here") == ("no call here", [])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "a"', "without </tool_call>"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'needs a "name"'),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ("<tool_call>3</tool_call>", "must be a JSON object, got int"),
    ],
)
def test_a_botched_call_is_reported(text: str, error: str) -> None:
    (call,) = parse_hermes(text)[1]
    assert error in call.error and call.arguments_json == "{}"
