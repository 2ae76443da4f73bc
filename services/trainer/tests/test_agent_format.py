"""Tool-call formats and the chat-template rendering of multi-turn trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlfleet_core.tool_calls import ParsedCall
from rlfleet_proto.v1 import reward_pb2
from rlfleet_trainer.agent.render import ChatRenderer, openai_tools
from rlfleet_trainer.agent.tool_format import (
    HermesFormat,
    NemotronFormat,
    split_reasoning,
    tool_call_format,
)

# A Qwen2.5-style template that reads `tools` and wraps tool results in <tool_response>
# inside a user turn (written for this test; the shape the Hermes/Qwen templates have).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}"
    "{{ messages[0].content }}\n\n{% endif %}# Tools\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- elif m.role != 'system' or not loop.first %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CALL = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'

KV = [
    reward_pb2.ToolSpec(
        name="add",
        description="Add.",
        parameters_json=json.dumps({"type": "object", "properties": {"key": {}}}),
    )
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 4.", []),
        (
            '<tool_call>\n{"name": "add", "arguments": {"key": "a", "amount": 2}}\n</tool_call>',
            [ParsedCall("add", '{"key": "a", "amount": 2}')],
        ),
        (  # two calls, text around them, arguments as a JSON string (OpenAI wire form)
            'ok <tool_call>{"name": "get_value", "arguments": "{\\"key\\": \\"a\\"}"}</tool_call>'
            ' and <tool_call>{"name": "submit"}</tool_call> done',
            [ParsedCall("get_value", '{"key": "a"}'), ParsedCall("submit", "{}")],
        ),
        ("<tool_call>{not json}</tool_call>", ["not valid JSON"]),
        ('<tool_call>{"arguments": {}}</tool_call>', ['needs a "name" string']),
        ('<tool_call>{"name": 3}</tool_call>', ['needs a "name" string']),
        ('<tool_call>["add"]</tool_call>', ["must be a JSON object, got str"]),
        (  # SmolLM2-1.7B's form: a list of calls in one block
            '<tool_call>[\n{"name": "add", "arguments": {"key": "a"}},\n{"name": "submit", '
            '"arguments": {}}\n]</tool_call>',
            [ParsedCall("add", '{"key": "a"}'), ParsedCall("submit", "{}")],
        ),
        ("<tool_call>[]</tool_call>", []),  # APIGen's "no call needed"
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', ["must be a JSON object"]),
        ('<tool_call>{"name": "add", "arguments": "{bad"}</tool_call>', ["is not valid JSON"]),
        ('<tool_call>{"name": "add", "arguments": {}}', ["<tool_call> without </tool_call>"]),
        ("<TOOLCALL>[]</TOOLCALL>", []),  # another format's tags are plain text here
    ],
)
def test_hermes_parses_calls_and_reports_malformed_ones(
    text: str, expected: list[ParsedCall | str]
) -> None:
    calls = HermesFormat().parse(text)
    assert len(calls) == len(expected)
    for call, want in zip(calls, expected, strict=True):
        if isinstance(want, str):
            assert want in call.error and call.arguments_json == "{}"
        else:
            assert call == want


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no calls", []),
        (
            '<TOOLCALL>[{"name": "add", "arguments": {"key": "a"}}, {"name": "submit", '
            '"arguments": {}}]</TOOLCALL>',
            [ParsedCall("add", '{"key": "a"}'), ParsedCall("submit", "{}")],
        ),
        ('<TOOLCALL>{"name": "submit"}</TOOLCALL>', [ParsedCall("submit", "{}")]),
        ("<TOOLCALL>[{oops</TOOLCALL>", ["not valid JSON"]),
        ('<TOOLCALL>[{"name": "a"}', ["<TOOLCALL> without </TOOLCALL>"]),
    ],
)
def test_nemotron_parses_a_list_of_calls(text: str, expected: list[ParsedCall | str]) -> None:
    calls = NemotronFormat().parse(text)
    assert len(calls) == len(expected)
    for call, want in zip(calls, expected, strict=True):
        assert (want in call.error) if isinstance(want, str) else call == want


@pytest.mark.parametrize(
    ("text", "answer", "reasoning", "calls"),
    [
        ("plain " + CALL, "plain " + CALL, "", 1),
        (
            "<think>maybe " + CALL + "?</think>\n\nNo call needed.",
            "No call needed.",
            "maybe " + CALL + "?",
            0,
        ),
        ("<think>ok</think>" + CALL, CALL, "ok", 1),
        ("<think>still thinking " + CALL, "", "still thinking " + CALL, 0),
    ],
)
def test_calls_are_read_from_the_answer_not_the_reasoning(
    text: str, answer: str, reasoning: str, calls: int
) -> None:
    assert split_reasoning(text) == (answer, reasoning)
    assert len(HermesFormat().parse(split_reasoning(text)[0])) == calls


def test_an_unknown_format_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"multi_turn.tool_call_format: unknown format 'xml'"):
        tool_call_format("xml")


def test_bad_tool_schemas_name_the_tool() -> None:
    bad = reward_pb2.ToolSpec(name="t", parameters_json="[1]")
    with pytest.raises(ValueError, match="tool 't': parameters_json must be a JSON object"):
        openai_tools([bad])
    assert openai_tools([reward_pb2.ToolSpec(name="s")])[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def tools_tokenizer(tokenizer: Any) -> Any:
    import copy

    other = copy.deepcopy(tokenizer)
    other.chat_template = TOOLS_TEMPLATE
    return other


MESSAGES = [{"role": "user", "content": "make a equal 3"}]


def test_a_template_without_tools_gets_them_in_the_system_message(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, HermesFormat())
    assert not renderer.template_reads_tools(MESSAGES)
    text = renderer.prompt_text(MESSAGES, openai_tools(KV))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "add"' in text and "<tool_call>" in text
    assert text.endswith("<|im_start|>user\nmake a equal 3<|im_end|>\n<|im_start|>assistant\n")
    # An existing system message keeps its text after the tool description.
    with_system = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    assert "</tool_call>\n\nBe brief.<|im_end|>" in renderer.prompt_text(
        with_system, openai_tools(KV)
    )


def test_a_template_with_tools_renders_them_itself(tools_tokenizer: Any) -> None:
    renderer = ChatRenderer(tools_tokenizer, HermesFormat())
    assert renderer.template_reads_tools(MESSAGES)
    text = renderer.prompt_text(MESSAGES, openai_tools(KV))
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>{")
    assert "<tool_call>" not in text  # the fallback instructions were not added


@pytest.mark.parametrize("template", ["chatml", "tools"])
def test_environment_tokens_continue_the_template_after_the_stop_token(
    tokenizer: Any, tools_tokenizer: Any, template: str
) -> None:
    """prompt + model turn (ending in its stop token) + environment tokens = the template's
    own rendering of the conversation, token for token."""
    tok = tokenizer if template == "chatml" else tools_tokenizer
    renderer = ChatRenderer(tok, HermesFormat())
    results = [
        reward_pb2.ToolResult(call_id="c0", name="add", content="3"),
        reward_pb2.ToolResult(call_id="c1", name="get_value", content="3"),
    ]
    reply = '<tool_call>{"name": "add", "arguments": {"key": "a", "amount": 3}}</tool_call>'
    model_ids = [*renderer.encode(reply), tok.convert_tokens_to_ids("<|im_end|>")]
    stop = tok.decode(model_ids[-1:], skip_special_tokens=False)
    env_text = renderer.environment_text(results, stop)
    ids = renderer.encode(renderer.prompt_text(MESSAGES, [])) + model_ids
    ids += renderer.encode(env_text)
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": reply},
        *({"role": "tool", "content": r.content} for r in results),
    ]
    expected = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False) == expected
    assert ids == renderer.encode(expected)
    assert env_text.endswith("<|im_start|>assistant\n") and not env_text.startswith(stop)


def test_a_turn_without_its_stop_token_gets_the_turn_closed(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, HermesFormat())
    results = [reward_pb2.ToolResult(call_id="c0", name="add", content="3")]
    assert renderer.environment_text(results, "").startswith("<|im_end|>\n<|im_start|>tool\n3")


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"max_turns": 0}, "multi_turn.max_turns"),
        ({"tool_call_format": "xml"}, "multi_turn.tool_call_format"),
        ({"max_trajectory_time_s": 0}, "multi_turn.max_trajectory_time_s"),
        ({"turns": 3}, "multi_turn.turns"),
    ],
)
def test_bad_multi_turn_settings_name_the_key(section: dict[str, Any], field: str) -> None:
    from pydantic import ValidationError
    from rlfleet_contracts.recipe import RecipeConfig

    with pytest.raises(ValidationError) as caught:
        RecipeConfig.model_validate({"multi_turn": section})
    [error] = caught.value.errors()
    assert ".".join(str(p) for p in error["loc"]) == field


def test_trajectories_must_fit_the_training_context() -> None:
    from pydantic import ValidationError
    from rlfleet_contracts.recipe import RecipeConfig

    with pytest.raises(ValidationError, match=r"multi_turn\.max_trajectory_tokens \(4096\) must"):
        RecipeConfig.model_validate(
            {
                "multi_turn": {"max_trajectory_tokens": 4096},
                "policy": {"max_total_sequence_length": 2048},
            }
        )
    fits = {
        "multi_turn": {"max_trajectory_tokens": 2048},
        "policy": {"max_total_sequence_length": 2048},
    }
    assert RecipeConfig.model_validate(fits).multi_turn.max_trajectory_tokens == 2048
