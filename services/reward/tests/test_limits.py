"""Malformed and oversized requests are refused before any work, naming the field and the
limit: HTTP 422 (malformed) / 413 (over a size limit), gRPC INVALID_ARGUMENT; never a 500,
never a failure discovered after scoring."""

from __future__ import annotations

import json
import re
from typing import Any

import grpc
import httpx
import pytest
from reward_support import RewardServer, nemo_response, score_request
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

_MB = 1 << 20
_DEEP = "[" * 100_000 + "]" * 100_000  # deeper than json's recursion limit
_DEEP_40 = "[" * 40 + "]" * 40  # parses, but deeper than limits.max_json_depth (32)
_BIG_INT = "9" * 5000


def _scored(server: RewardServer) -> float:
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    pattern = r"^rlfleet_reward_results_total\{[^}]*\} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, flags=re.MULTILINE))


def _math_body(extra: str = "", text: str = r"\boxed{4}") -> str:
    """A valid math verify body (as JSON text, so it can carry what json.dumps cannot)."""
    response = json.dumps(nemo_response(text))
    return f'{{"expected_answer": "4", "response": {response}{extra}}}'


def _call_body(arguments: str) -> str:
    response = nemo_response("", function_calls=[{"name": "f", "arguments": {}}])
    response["output"][0]["arguments"] = "ARGS"
    row = {"expected_tool_call": {"name": "f", "arguments": {}}}
    return json.dumps({**row, "response": response}).replace('"ARGS"', json.dumps(arguments))


HTTP_CASES = [
    # (id, route, body, status, field, words in the message)
    ("deep-nesting", "math", _math_body(f', "x": {_DEEP}'), 422, "", "max_json_depth"),
    (
        "nesting-40",
        "math",
        _math_body(f', "x": {_DEEP_40}'),
        422,
        "x" + "[0]" * 32,
        "max_json_depth",
    ),
    ("5000-digit-int", "math", _math_body(f', "seed": {_BIG_INT}'), 422, "seed", "max_int_digits"),
    ("nan", "math", _math_body(', "x": NaN'), 422, "x", "NaN"),
    ("infinity", "math", _math_body(', "x": [1, -Infinity]'), 422, "x[1]", "Infinity"),
    ("1e999", "math", _math_body(', "x": {"y": 1e999}'), 422, "x.y", "finite"),
    ("lone-surrogate", "math", _math_body(', "x": "a\\ud800b"'), 422, "x", "surrogate"),
    ("surrogate-key", "math", _math_body(', "x": {"\\udfff": 1}'), 422, "x.<key>", "surrogate"),
    (
        "surrogate-in-answer",
        "math",
        _math_body(text="\\boxed{4}\ud800"),  # json.dumps escapes it as \ud800
        422,
        "response.output[0].content[0].text",
        "surrogate",
    ),
    (
        "2000-digit-int",  # parses (Python's cap is 4300), still over max_int_digits
        "math",
        _math_body(', "x": {"y": -' + "1" * 2000 + "}"),
        422,
        "x.y",
        "an integer of 2000 digits exceeds limits.max_int_digits (1000)",
    ),
    ("tool-args-deep", "tool_use", _call_body(_DEEP), 422, "response.output[0].arguments", "depth"),
    (
        "tool-args-nested-40",
        "tool_use",
        _call_body('{"a": ' + _DEEP_40 + "}"),
        422,
        "response.output[0].arguments.a" + "[0]" * 31,
        "max_json_depth",
    ),
    (
        "tool-args-big-int",
        "tool_use",
        _call_body('{"a": ' + _BIG_INT + "}"),
        422,
        "response.output[0].arguments.a",
        "max_int_digits",
    ),
    (
        "tool-args-nan",
        "tool_use",
        _call_body('{"a": NaN}'),
        422,
        "response.output[0].arguments.a",
        "NaN",
    ),
    (
        "huge-output-tokens",
        "math",
        _math_body().replace(
            '"tools": []', '"tools": [], "usage": {"output_tokens": ' + "9" * 40 + "}"
        ),
        422,
        "response.usage.output_tokens",
        "integer in",
    ),
    (
        "too-many-items",
        "math",
        _math_body(', "x": ' + json.dumps([0] * 10_001)),
        413,
        "x",
        "max_json_items",
    ),
    (
        "too-many-instructions",
        "instruction_following",
        json.dumps(
            {
                "instruction_id_list": ["punctuation:no_comma"] * 40_000,
                "response": nemo_response("hello"),
            }
        ),
        413,
        "instruction_id_list",
        "max_field_items",
    ),
    (
        "row-too-large",
        "math",
        _math_body(', "x": "' + "a" * (_MB + 1) + '"'),
        413,
        "",
        "max_row_chars",
    ),
    (
        "answer-too-large",
        "math",
        _math_body(text="1" * (_MB + 1)),
        413,
        "response",
        "max_response_chars",
    ),
    (
        "body-too-large",
        "math",
        _math_body(', "x": "' + "a" * (9 * _MB) + '"'),
        413,
        "",
        "max_request_bytes",
    ),
]


@pytest.mark.parametrize(
    ("route", "body", "status", "field", "words"),
    [c[1:] for c in HTTP_CASES],
    ids=[c[0] for c in HTTP_CASES],
)
def test_http_refuses_before_scoring(
    reward_server: RewardServer, route: str, body: str, status: int, field: str, words: str
) -> None:
    scored_before = _scored(reward_server)
    reply = httpx.post(
        f"{reward_server.http_url}/{route}/verify",
        content=body.encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == status, reply.text[:500]
    data = reply.json()
    assert data["field"] == field, data
    assert words in data["detail"][0]["msg"], data
    assert _scored(reward_server) == scored_before  # refused before any work


def test_http_body_not_utf8_is_422(reward_server: RewardServer) -> None:
    reply = httpx.post(
        f"{reward_server.http_url}/math/verify", content=b'{"x": "\xff"}', timeout=10
    )
    assert reply.status_code == 422, reply.text
    assert "UTF-8" in reply.json()["detail"][0]["msg"]


def _row(extra: str) -> str:
    return '{"expected_answer": "4"' + extra + "}"


GRPC_CASES = [
    # (id, request, field, words)
    (
        "deep-nesting",
        score_request("math", _row(f', "x": {_DEEP}'), "4"),
        "row_json",
        "max_json_depth",
    ),
    (
        "5000-digit-int",
        score_request("math", _row(f', "x": {_BIG_INT}'), "4"),
        "row.x",
        "max_int_digits",
    ),
    ("nan", score_request("math", _row(', "x": NaN'), "4"), "row.x", "NaN"),
    ("lone-surrogate", score_request("math", _row(', "x": "\\udc00"'), "4"), "row.x", "surrogate"),
    (
        "row-too-large",
        score_request("math", _row(', "x": "' + "a" * _MB + '"'), "4"),
        "row_json",
        "max_row_chars",
    ),
    (
        "answer-too-large",
        score_request("math", _row(""), "1" * (_MB + 1)),
        "response",
        "max_response_chars",
    ),
    (
        "too-many-instructions",
        score_request(
            "instruction_following", {"instruction_id_list": ["punctuation:no_comma"] * 300}, "hi"
        ),
        "row.instruction_id_list",
        "max_field_items",
    ),
    (
        "100k-char-env-name",  # was echoed whole: the status trailer overflowed, no answer
        reward_pb2.ScoreRequest(env="e" * 100_000, row_json="{}"),
        "env",
        "unknown environment 'eeee",
    ),
    (
        "100k-char-key",
        score_request("math", _row(', "' + "k" * 100_000 + '": NaN'), "4"),
        "row." + "k" * 97 + "...",
        "NaN",
    ),
    (
        "string-field-nested-too-deep",
        score_request("structured_outputs", {"schema_str": _DEEP}, "{}"),
        "row",
        "cannot parse",
    ),
]


@pytest.mark.parametrize(
    ("request_", "field", "words"), [c[1:] for c in GRPC_CASES], ids=[c[0] for c in GRPC_CASES]
)
def test_grpc_refuses_before_scoring(
    reward_server: RewardServer,
    stub: reward_pb2_grpc.RewardServiceStub,
    request_: reward_pb2.ScoreRequest,
    field: str,
    words: str,
) -> None:
    scored_before = _scored(reward_server)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Score(request_, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    details = caught.value.details() or ""
    assert details.startswith(f"{field}: "), details
    assert words in details, details
    assert _scored(reward_server) == scored_before


def test_grpc_group_over_max_group_size(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    request = reward_pb2.ScoreGroupRequest(
        env="math",
        row_json=_row(""),
        responses=[reward_pb2.Response(text="4")] * 1025,
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.ScoreGroup(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(
        "responses: 1025 responses exceed limits.max_group_size"
    )


def test_grpc_request_over_max_request_bytes(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    request = reward_pb2.ScoreGroupRequest(
        env="math", row_json=_row(""), responses=[reward_pb2.Response(text="1" * _MB)] * 9
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.ScoreGroup(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limits.max_request_bytes" in (caught.value.details() or "")


def test_stream_item_with_nan_is_invalid_row(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    items = [
        score_request("math", _row(', "x": NaN'), "4", request_id="bad"),
        score_request("math", _row(""), r"\boxed{4}", request_id="good"),
    ]
    results: dict[str, Any] = {r.request_id: r for r in stub.ScoreStream(iter(items), timeout=30)}
    assert results["bad"].failure_kind == reward_pb2.FAILURE_KIND_INVALID_ROW
    assert results["bad"].failure_reason.startswith("row.x: ")
    assert results["good"].reward == 1.0


def test_deeply_nested_tool_arguments_are_malformed_not_a_crash() -> None:
    """A policy's tool call whose arguments string nests 100k deep made json.loads raise
    RecursionError out of tool_use (swe_pivot already caught it; both share the parser)."""
    from rlfleet_reward.environments.tool_use import decode_arguments

    assert decode_arguments("[" * 100_000) is None
    assert decode_arguments('{"a": 1}') == {"a": 1} and decode_arguments("") == {}
