"""`tool_use`: a single-step tool call, compared by name and arguments.

Row fields:
- `expected_tool_call` (required): `{"name": str, "arguments": object or JSON string}`.
- `argument_match` (optional): `exact` (default: equal after JSON decoding, 1 == 1.0) or
  `normalized` (also trims and case-folds strings and compares numbers to 1e-6).
- `partial_credit` (optional, default false): reward = 0.5·(name matches) +
  0.5·(fraction of argument keys that match), as components `tool_name` and `arguments`;
  otherwise 1 only when name and all arguments match (component `tool_call`).

The call is read from structured tool calls when the face received them (NeMo-Gym
`function_call` output items), else from the text: `<tool_call>{...}</tool_call>`
(Hermes/Qwen/Nemotron format), else a JSON object with `name` and `arguments` (or
`parameters`), bare or in a ```json fence. More than one call is wrong: the task is one step.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, optional_bool, require
from rlfleet_reward.text import code_blocks
from rlfleet_reward.types import RowError, Sample, Score, ToolCall, scored


@dataclass(frozen=True)
class ToolUseSpec:
    name: str
    arguments_json: str
    normalized: bool
    partial_credit: bool


def decode_arguments(raw: Any) -> dict[str, Any] | None:
    """Arguments as an object, from an object or a JSON string; None if not an object."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nesting too deep
            return None
    return raw if isinstance(raw, dict) else None


def _call_from_object(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI chat tool_calls shape
        return _call_from_object(obj["function"])
    arguments = decode_arguments(obj.get("arguments", obj.get("parameters", {})))
    return None if arguments is None else ToolCall(obj["name"], arguments)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], int]:
    """(calls found in text, number of candidate calls that did not parse)."""
    candidates = re.findall(r"<tool_call>(.*?)</tool_call>", text, flags=re.DOTALL)
    if not candidates:
        candidates = [body for lang, body in code_blocks(text) if lang in ("json", "")]
    if not candidates and text.strip().startswith(("{", "[")):
        candidates = [text.strip()]
    calls, bad = [], 0
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            bad += 1
            continue
        for item in obj if isinstance(obj, list) else [obj]:
            call = _call_from_object(item)
            if call is None:
                bad += 1
            else:
                calls.append(call)
    return calls, bad


def values_match(expected: Any, got: Any, normalized: bool) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got if isinstance(expected, bool) and isinstance(got, bool) else False
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return (
            math.isclose(expected, got, rel_tol=1e-6, abs_tol=1e-6)
            if normalized
            else expected == got
        )
    if isinstance(expected, str) and isinstance(got, str):
        return (
            expected.strip().casefold() == got.strip().casefold() if normalized else expected == got
        )
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(
            values_match(e, g, normalized) for e, g in zip(expected, got, strict=True)
        )
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(
            values_match(v, got[k], normalized) for k, v in expected.items()
        )
    return bool(expected == got)


class ToolUseEnvironment(Environment):
    name: ClassVar[str] = "tool_use"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "Single-step tool call: function name and arguments compared with the expected call."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_tool_call",)
    optional_fields: ClassVar[tuple[str, ...]] = (
        "argument_match",
        "partial_credit",
        "responses_create_params",
    )

    def parse_row(self, row: Mapping[str, Any]) -> ToolUseSpec:
        expected = require(row, "expected_tool_call")
        if not isinstance(expected, dict):
            raise RowError(
                "expected_tool_call",
                f"expected an object with name and arguments, got {type(expected).__name__}",
            )
        name = expected.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RowError("expected_tool_call.name", "required: the function name")
        arguments = decode_arguments(expected.get("arguments", {}))
        if arguments is None:
            raise RowError(
                "expected_tool_call.arguments", "expected an object or a JSON string of one"
            )
        normalized = choice(row, "argument_match", ("exact", "normalized"), "exact") == "normalized"
        return ToolUseSpec(
            name, json.dumps(arguments), normalized, optional_bool(row, "partial_credit", False)
        )

    def score(self, spec: ToolUseSpec, sample: Sample) -> Score:
        calls, bad = (
            (list(sample.tool_calls), 0) if sample.tool_calls else parse_tool_calls(sample.text)
        )
        expected = json.loads(spec.arguments_json)
        if len(calls) != 1:
            verdict = (
                "no_call"
                if not calls and not bad
                else ("malformed_call" if not calls else "multiple_calls")
            )
            zero = (
                {"tool_name": 0.0, "arguments": 0.0} if spec.partial_credit else {"tool_call": 0.0}
            )
            return scored(zero, verdict=verdict, num_calls=len(calls), unparsed_calls=bad)
        call = calls[0]
        name_ok = call.name == spec.name
        keys = set(expected) | set(call.arguments)
        matched = [
            k
            for k in keys
            if k in expected
            and k in call.arguments
            and values_match(expected[k], call.arguments[k], spec.normalized)
        ]
        args_ok = len(matched) == len(keys)
        info = {
            "called": call.name,
            "arguments": json.dumps(call.arguments, sort_keys=True),
            "verdict": "correct"
            if name_ok and args_ok
            else ("wrong_name" if not name_ok else "wrong_arguments"),
        }
        if spec.partial_credit:
            fraction = len(matched) / len(keys) if keys else 1.0
            return scored(
                {"tool_name": 0.5 if name_ok else 0.0, "arguments": 0.5 * fraction}, **info
            )
        return scored({"tool_call": 1.0 if name_ok and args_ok else 0.0}, **info)
