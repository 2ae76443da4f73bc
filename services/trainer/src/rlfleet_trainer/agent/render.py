"""Token ids for a multi-turn trajectory, through the model's own chat template.

The model's tokens are never re-tokenized: a trajectory grows by appending, turn by turn,
what the model generated (its exact ids) and the *environment tokens* that follow it: the
text the chat template puts after an assistant turn, for the tool messages, up to and
including the next assistant header. That text is found by rendering a fixed stand-in
conversation (user, assistant, tool messages) and cutting it after the stand-in
assistant's content, so it does not depend on how the template would re-render the
model's own turn (Qwen3, for one, drops the reasoning of earlier turns).

Tools: the template renders them when it reads `tools=` (Qwen2.5, Qwen3, Hermes, Llama 3.1
...); a template that ignores them (its output is the same with and without) gets them
described in the system message by the tool-call format's `instructions` instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from rlfleet_proto.v1 import reward_pb2

from rlfleet_trainer.agent.tool_format import ToolCallFormat

# Stand-ins for the environment-token render; they never reach the model.
_USER = "rlfleet-user-stand-in"
_ASSISTANT = "rlfleet-assistant-stand-in"


def openai_tools(specs: Sequence[reward_pb2.ToolSpec]) -> list[dict[str, Any]]:
    """The episode's tools in OpenAI function-tool shape (what chat templates read)."""
    tools = []
    for spec in specs:
        try:
            parameters = json.loads(spec.parameters_json) if spec.parameters_json else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool {spec.name!r}: parameters_json is not JSON: {exc}") from None
        if not isinstance(parameters, dict):
            raise ValueError(f"tool {spec.name!r}: parameters_json must be a JSON object")
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": parameters or {"type": "object", "properties": {}},
                },
            }
        )
    return tools


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` leading the system message (one is added if there is none)."""
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{text}\n\n{messages[0].get('content', '')}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class ChatRenderer:
    def __init__(
        self, tokenizer: Any, fmt: ToolCallFormat, template_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.format = fmt
        self.template_kwargs = dict(template_kwargs or {})

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, **{**self.template_kwargs, **kwargs}
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def template_reads_tools(self, messages: list[dict[str, Any]]) -> bool:
        probe = [{"type": "function", "function": {"name": "probe", "parameters": {}}}]
        plain = self._render(messages, add_generation_prompt=True)
        return self._render(messages, tools=probe, add_generation_prompt=True) != plain

    def prompt_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The first prompt: the row's messages with the episode's tools, generation prompt
        added (`template_kwargs`: the row's own, over the recipe's)."""
        kwargs = {**(template_kwargs or {}), "add_generation_prompt": True}
        if not tools:
            return self._render(messages, **kwargs)
        if self.template_reads_tools(messages):
            return self._render(messages, tools=tools, **kwargs)
        return self._render(with_system_text(messages, self.format.instructions(tools)), **kwargs)

    def environment_text(
        self,
        results: Sequence[reward_pb2.ToolResult],
        after_stop: str = "",
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """What follows a model turn that called tools: the end of the assistant turn (less
        `after_stop`, the text of the stop token the model already generated), the tool
        messages, and the next assistant header."""
        kwargs = {**(template_kwargs or {}), "add_generation_prompt": True}
        head = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        tool_messages = [
            {"role": "tool", "name": r.name, "tool_call_id": r.call_id, "content": r.content}
            for r in results
        ]
        try:
            full = self._render(head + tool_messages, **kwargs)
        except TemplateError:
            # Templates without a tool role (some insist on user/assistant turns): the
            # results go back as one user message, Hermes-style.
            wrapped = "\n".join(f"<tool_response>\n{r.content}\n</tool_response>" for r in results)
            full = self._render([*head, {"role": "user", "content": wrapped}], **kwargs)
        after = full[full.index(_ASSISTANT) + len(_ASSISTANT) :]
        if after_stop and after.startswith(after_stop):
            after = after[len(after_stop) :]
        return after
