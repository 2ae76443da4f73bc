"""The tools an episode shows the policy: the row's `responses_create_params.tools`, else
the environment's own.

Row tools come in either OpenAI shape: Responses (`{"type": "function", "name", ...}`,
as NeMo-Gym rows have them) or Chat Completions (`{"type": "function", "function":
{...}}`). Each must name a tool the environment implements; its description and schema
are what the policy sees, while calls are checked against the environment's own schema
(the one its implementation relies on).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlfleet_reward.episodes.base import Tool
from rlfleet_reward.types import RowError


def row_tools(row: Mapping[str, Any], own: tuple[Tool, ...]) -> tuple[Tool, ...]:
    params = row.get("responses_create_params")
    if params is None:
        return own
    if not isinstance(params, dict):
        raise RowError("responses_create_params", "expected an object")
    tools = params.get("tools")
    if tools is None:
        return own
    where = "responses_create_params.tools"
    if not isinstance(tools, list) or not tools:
        raise RowError(where, "expected a non-empty array of function tools")
    names = {tool.name: tool for tool in own}
    shown: list[Tool] = []
    for i, item in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise RowError(at, "expected a function tool object")
        inner = item.get("function")
        body: dict[str, Any] = inner if isinstance(inner, dict) else item
        name = body.get("name")
        if not isinstance(name, str) or name not in names:
            raise RowError(
                f"{at}.name",
                f"{str(name)[:100]!r} is not a tool of this environment; its tools: "
                + ", ".join(names),
            )
        description = body.get("description", names[name].description)
        parameters = body.get("parameters", names[name].parameters)
        if not isinstance(description, str):
            raise RowError(f"{at}.description", "expected a string")
        if not isinstance(parameters, dict):
            raise RowError(f"{at}.parameters", "expected a JSON Schema object")
        if any(t.name == name for t in shown):
            raise RowError(f"{at}.name", f"{name!r} is listed twice")
        shown.append(Tool(name, description, parameters))
    return tuple(shown)


def schema_json(tool: Tool) -> str:
    return json.dumps(tool.parameters, sort_keys=True)
