"""The OpenAI face with the real `openai` client over loopback, on engine=scripted (the
model's turns are known, so tool calls and streamed text are exact): streaming in OpenAI's
chunk formats, tool calls parsed from `<tool_call>` blocks, top_logprobs, /tokenize and
/detokenize, and unknown or unsupported fields refused with 400 naming them. The top-k
logprobs of real models (hf, vllm) are checked in test_engines.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from rlfleet_core.testing import running_service
from rlfleet_rollout.service import SERVICE

pytestmark = pytest.mark.asyncio(loop_scope="module")

CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
TURN_1 = f"Let me add.{CALL}"
TURN_2 = "The sum is 3."
TURN_3 = '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>'  # botched
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is 1 + 2?"}]
# The prompt holds turn 1, so the script answers with turn 2.
ANSWERED = [
    *ASK,
    {"role": "assistant", "content": TURN_1},
    {"role": "tool", "content": "3"},
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    script = tmp_path_factory.mktemp("script") / "turns.jsonl"
    script.write_text("".join(json.dumps({"text": t}) + "\n" for t in (TURN_1, TURN_2, TURN_3)))
    overrides = ["engine=scripted", f"script_path={script}", "model=tiny"]
    async with running_service(SERVICE, overrides, http=True) as running:
        yield f"http://127.0.0.1:{running.http_port}"


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=60, max_retries=0)


async def test_streams_chat_completion_and_response(base_url: str) -> None:
    client = _client(base_url)

    def run() -> tuple[list[Any], list[Any], list[Any]]:
        chat = client.chat.completions.create(
            model="tiny",
            messages=ANSWERED,
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
        )
        completion = client.completions.create(
            model="tiny", prompt="Say it.", max_tokens=200, stream=True
        )
        response = client.responses.create(model="tiny", input=ANSWERED, stream=True)
        return list(chat), list(completion), list(response)

    chat, completion, response = await asyncio.to_thread(run)
    assert {c.object for c in chat} == {"chat.completion.chunk"}
    assert chat[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == TURN_2
    assert [c.choices[0].finish_reason for c in chat if c.choices][-1] == "stop"
    assert chat[-1].choices == [] and chat[-1].usage is not None
    assert chat[-1].usage.completion_tokens > 0

    assert "".join(c.choices[0].text for c in completion) == TURN_1  # no tools: raw text
    assert completion[-1].choices[0].finish_reason == "stop"

    kinds = [e.type for e in response]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = [e.delta for e in response if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TURN_2
    assert response[-1].response.output_text == TURN_2


async def test_tool_calls_are_parsed(base_url: str) -> None:
    client = _client(base_url)

    def run() -> tuple[Any, Any, list[Any], Any, Any]:
        chat = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
        plain = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice="none"
        )
        stream = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, stream=True
        )
        response = client.responses.create(
            model="tiny",
            input="What is 1 + 2?",
            tools=[{"type": "function", **TOOLS[0]["function"]}],
        )
        # The call and its output go back in, as an agent loop sends them.
        call = next(o for o in response.output if o.type == "function_call")
        follow = client.responses.create(
            model="tiny",
            input=[
                {"role": "user", "content": "What is 1 + 2?"},
                {"role": "assistant", "content": TURN_1},
                {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
            ],
        )
        return chat, plain, list(stream), response, follow

    chat, plain, stream, response, follow = await asyncio.to_thread(run)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content == TURN_1

    streamed = [d for c in stream for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name) for d in streamed] == [(0, "add")]
    assert stream[-1].choices[0].finish_reason == "tool_calls"

    kinds = [o.type for o in response.output]
    assert kinds == ["message", "function_call"]
    fc = response.output[1]
    assert fc.name == "add" and json.loads(fc.arguments) == {"a": 1, "b": 2}
    assert follow.output_text == TURN_2


async def test_a_botched_tool_call_stays_content(base_url: str) -> None:
    """A turn whose `<tool_call>` block is not a valid call comes back as plain content
    (finish_reason stop), as vLLM's parsers do, not as a 500 or an empty answer."""
    messages = [
        *ANSWERED,
        {"role": "assistant", "content": TURN_2},
        {"role": "user", "content": "?"},
    ]
    chat = await asyncio.to_thread(
        _client(base_url).chat.completions.create, model="tiny", messages=messages, tools=TOOLS
    )
    choice = chat.choices[0]
    assert choice.message.content == TURN_3 and choice.message.tool_calls is None
    assert choice.finish_reason == "stop"


async def test_top_logprobs(base_url: str) -> None:
    client = _client(base_url)
    chat = await asyncio.to_thread(
        client.chat.completions.create,
        model="tiny",
        messages=ANSWERED,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content).startswith(TURN_2)
    # The script's token is certain: the only candidate, at logprob 0.
    assert all([(a.token, a.logprob) for a in t.top_logprobs] == [(t.token, 0.0)] for t in content)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"functions": []}, "functions"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
    ],
)
async def test_unknown_or_unsupported_fields_are_400(
    base_url: str, extra: dict[str, Any], field: str
) -> None:
    client = _client(base_url)
    with pytest.raises(openai.BadRequestError) as info:
        await asyncio.to_thread(
            client.chat.completions.create, model="tiny", messages=ASK, extra_body=extra
        )
    assert info.value.body["param"] == field  # type: ignore[index]
    assert field in info.value.message


async def test_user_and_metadata_are_accepted(base_url: str) -> None:
    chat = await asyncio.to_thread(
        _client(base_url).chat.completions.create,
        model="tiny",
        messages=ANSWERED,
        user="someone",
        metadata={"run": "x"},
        tool_choice="auto",
        parallel_tool_calls=True,
    )
    assert chat.choices[0].message.content == TURN_2


async def test_tokenize_detokenize_round_trip(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        text = "What is 1 + 2?"
        tokens = (await http.post("/tokenize", json={"model": "tiny", "prompt": text})).json()
        assert tokens["count"] == len(tokens["tokens"]) > 0
        assert tokens["max_model_len"] > 0
        back = await http.post("/detokenize", json={"model": "tiny", "tokens": tokens["tokens"]})
        assert back.json() == {"prompt": text}

        chat = (await http.post("/tokenize", json={"model": "tiny", "messages": ASK})).json()
        sent = await http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": ASK, "max_tokens": 1}
        )
        assert chat["tokens"] == sent.json()["choices"][0]["message"]["prompt_token_ids"]

        for path, body, field in [
            ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
            ("/tokenize", {"prompt": "a", "messages": ASK}, "prompt"),
            ("/tokenize", {"prompt": "a", "nope": 1}, "nope"),
        ]:
            bad = await http.post(path, json=body)
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"]["param"] == field


@pytest.mark.parametrize(
    ("path", "fields", "field"),
    [
        ("/v1/chat/completions", '"temperature": NaN', "temperature"),
        ("/v1/chat/completions", '"temperature": Infinity', "temperature"),
        ("/v1/chat/completions", '"temperature": 1e999', "temperature"),  # a double's inf
        ("/v1/chat/completions", '"temperature": 1e300', "temperature"),  # inf in float32
        ("/v1/chat/completions", '"top_p": -Infinity', "top_p"),
        ("/v1/chat/completions", '"top_p": 5', "top_p"),  # was quietly read as 1
        ("/v1/chat/completions", '"repetition_penalty": NaN', "repetition_penalty"),
        ("/v1/chat/completions", '"repetition_penalty": 1e300', "repetition_penalty"),
        ("/v1/chat/completions", '"frequency_penalty": NaN', "frequency_penalty"),
        ("/v1/chat/completions", '"logit_bias": {"5": NaN}', "logit_bias.5"),
        ("/v1/chat/completions", '"metadata": {"x": [1, NaN]}', "metadata.x.1"),
        ("/v1/chat/completions", '"top_k": -2', "top_k"),
        ("/v1/chat/completions", f'"seed": {1 << 70}', "seed"),
        ("/v1/completions", '"temperature": NaN', "temperature"),
        ("/v1/responses", '"top_p": NaN', "top_p"),
        ("/tokenize", '"add_generation_prompt": true, "x": NaN', "x"),
    ],
)
async def test_non_finite_or_out_of_range_numbers_are_400(
    base_url: str, path: str, fields: str, field: str
) -> None:
    """JSON's missing NaN/Infinity literals (Python's parser reads them) and values that
    overflow float32 are refused naming the field, as the gRPC face refuses them; a NaN
    temperature used to answer 200 (neither greedy nor sampled: token 0 every step)."""
    prompt = {
        "/v1/chat/completions": '"messages": [{"role": "user", "content": "2+2?"}]',
        "/v1/completions": '"prompt": "2+2?"',
        "/v1/responses": '"input": "2+2?"',
        "/tokenize": '"prompt": "2+2?"',
    }[path]
    limit = ', "max_tokens": 4' if path.endswith("completions") else ""
    body = f'{{"model": "tiny", {prompt}{limit}, {fields}}}'
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        reply = await http.post(path, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and field in error["message"], error
