"""Tool calls written in a model's text, Hermes/Qwen style: `<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, one block per call; a block may also hold a JSON list of
calls (SmolLM2's function-calling data). The same convention the chat templates of Qwen2.5,
Qwen3 and Hermes render `tools=` with.

Shared by services (the rollout's OpenAI face parses calls into `tool_calls`); a call the
model botched comes back with `error` set instead of raising.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)(" + re.escape(CLOSE_TAG) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments_json: str
    """The arguments object as JSON ("{}" when the call is malformed)."""
    error: str = ""
    """Why the call is malformed; "" for a well-formed call."""


def call_from_object(obj: Any) -> ParsedCall:
    """A call from a decoded `{"name": ..., "arguments": {...}}`; `arguments` may also be a
    JSON string holding an object (OpenAI's wire form)."""
    if not isinstance(obj, dict):
        return ParsedCall("", "{}", f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall("", "{}", 'a tool call needs a "name" string')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ParsedCall(name, "{}", f'"arguments" of {name} is not valid JSON: {exc}')
    if not isinstance(arguments, dict):
        return ParsedCall(name, "{}", f'"arguments" of {name} must be a JSON object')
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def parse_hermes(text: str) -> tuple[str, list[ParsedCall]]:
    """(the text outside the blocks, stripped; the calls in order)."""
    calls: list[ParsedCall] = []
    for match in _BLOCK.finditer(text):
        if not match.group(2):
            calls.append(ParsedCall("", "{}", f"{OPEN_TAG} without {CLOSE_TAG}"))
            continue
        try:
            obj = json.loads(match.group(1).strip())
        except json.JSONDecodeError as exc:
            calls.append(ParsedCall("", "{}", f"the tool call is not valid JSON: {exc}"))
            continue
        calls.extend(call_from_object(item) for item in (obj if isinstance(obj, list) else [obj]))
    return _BLOCK.sub("", text).strip(), calls
