"""Messages of the OpenAI face as chat templates read them, and tool calls parsed out of
a model's turn (Hermes/Qwen `<tool_call>` blocks: rlfleet_core.tool_calls)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from rlfleet_core.errors import InvalidArgument
from rlfleet_core.tool_calls import parse_hermes

from rlfleet_rollout.openai_bodies import ResponsesBody
from rlfleet_rollout.types import Sample


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """One message as chat templates read it: text content; an assistant's tool calls with
    their arguments as an object (templates render them with `tojson`)."""
    out: dict[str, Any] = {"role": str(m.get("role", "user")), "content": _text(m.get("content"))}
    calls = []
    for call in m.get("tool_calls") or []:
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except json.JSONDecodeError as exc:
                raise InvalidArgument("messages.tool_calls.function.arguments", str(exc)) from exc
        calls.append({**call, "function": fn})
    if calls:
        out["tool_calls"] = calls
    for key in ("name", "tool_call_id"):
        if m.get(key):
            out[key] = m[key]
    return out


def tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of a turn: well-formed `<tool_call>` blocks become
    calls; a turn with a malformed one is left as plain content (as vLLM's parsers do)."""
    rest, calls = parse_hermes(text)
    if not calls or any(c.error for c in calls):
        return text, []
    return rest or None, [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_json},
        }
        for c in calls
    ]


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flat) in the chat shape templates read."""
    if "function" in tool:
        return tool
    spec = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": spec}


def response_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*messages, {"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message" and "role" in item:
            messages.append({"role": item["role"], "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "content": str(item.get("output", "")),
                    "tool_call_id": item.get("call_id", ""),
                }
            )
        else:
            raise InvalidArgument(f"input[{i}].type", f"{kind!r} items are not supported")
    return messages


def usage_of(samples: list[Sample]) -> dict[str, int]:
    prompt = len(samples[0].prompt_token_ids) if samples else 0
    completion = sum(len(s.token_ids) for s in samples)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def training_fields(sample: Sample) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(sample.prompt_token_ids),
        "generation_token_ids": list(sample.token_ids),
        "generation_log_probs": list(sample.logprobs),
        "weight_version_first": sample.weight_version_first,
        "weight_version_last": sample.weight_version_last,
    }
