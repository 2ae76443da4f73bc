"""Tool-call formats: how a model writes tool calls in its text, and how tools are
described to it when the chat template cannot render them.

A format is a named choice (`multi_turn.tool_call_format`); add one by subclassing
`ToolCallFormat` and listing it in `FORMATS`.

A call the model botched (bad JSON, no name, arguments not an object, an unclosed tag) is
not an exception: it comes back as a `ParsedCall` with `error` set, and the rollout loop
answers it with a tool error result the model sees on its next turn.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from rlfleet_core.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    ParsedCall,
    call_from_object,
    parse_hermes,
)


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning) of one model turn with an optional `<think>...</think>` part.
    Tool calls are read from the answer only: a call the model merely considered while
    reasoning is not made. A turn that opened `<think>` and never closed it has no answer.
    (The reward gateway splits a final answer the same way.)"""
    if "</think>" in text:
        reasoning, _, answer = text.rpartition("</think>")
        return answer.strip(), reasoning.replace("<think>", "", 1).strip()
    if "<think>" in text:
        before, _, reasoning = text.partition("<think>")
        return before.strip(), reasoning.strip()
    return text, ""


class ToolCallFormat:
    """Parses tool calls out of one model turn and describes tools in plain text."""

    name: ClassVar[str]

    def parse(self, text: str) -> list[ParsedCall]:
        raise NotImplementedError

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """A system-message text describing `tools` (OpenAI function-tool shape) and how to
        call them: the fallback for chat templates that ignore `tools=`."""
        raise NotImplementedError


class HermesFormat(ToolCallFormat):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call
    (Hermes, Qwen2.5, Qwen3); a block may also hold a JSON list of calls, as SmolLM2-1.7B
    writes them (its function-calling SFT data, APIGen: `<tool_call>[{...}, ...]</tool_call>`)."""

    name = "hermes"
    open_tag, close_tag = OPEN_TAG, CLOSE_TAG

    def parse(self, text: str) -> list[ParsedCall]:
        return parse_hermes(text)[1]

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more of these functions:\n<tools>\n"
            f"{listed}\n</tools>\n\nTo call one, write a JSON object with its name and "
            f"arguments inside {self.open_tag}{self.close_tag} tags:\n{self.open_tag}\n"
            f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{self.close_tag}'
        )


class NemotronFormat(ToolCallFormat):
    """`<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`: one block holding a
    JSON list of calls (Nemotron)."""

    name = "nemotron"
    open_tag, close_tag = "<TOOLCALL>", "</TOOLCALL>"

    def parse(self, text: str) -> list[ParsedCall]:
        calls: list[ParsedCall] = []
        pattern = re.escape(self.open_tag) + r"(.*?)(" + re.escape(self.close_tag) + r"|$)"
        for match in re.finditer(pattern, text, flags=re.DOTALL):
            if not match.group(2):
                calls.append(ParsedCall("", "{}", f"{self.open_tag} without {self.close_tag}"))
                continue
            try:
                items = json.loads(match.group(1).strip())
            except json.JSONDecodeError as exc:
                calls.append(ParsedCall("", "{}", f"the tool call list is not valid JSON: {exc}"))
                continue
            if not isinstance(items, list):
                items = [items]
            calls.extend(call_from_object(item) for item in items)
        return calls

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        listed = json.dumps(tools, ensure_ascii=False)
        return (
            f"You can use the following tools: <AVAILABLE_TOOLS>{listed}</AVAILABLE_TOOLS>\n"
            f"To call tools, write a JSON list of calls inside {self.open_tag}"
            f"{self.close_tag}:\n{self.open_tag}"
            f'[{{"name": <function-name>, "arguments": <args-json-object>}}]{self.close_tag}'
        )


FORMATS: dict[str, type[ToolCallFormat]] = {f.name: f for f in (HermesFormat, NemotronFormat)}


def tool_call_format(name: str) -> ToolCallFormat:
    if name not in FORMATS:
        raise ValueError(
            f"multi_turn.tool_call_format: unknown format {name!r}; known: {sorted(FORMATS)}"
        )
    return FORMATS[name]()
