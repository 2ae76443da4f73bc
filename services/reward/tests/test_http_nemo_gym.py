"""The NeMo-Gym-compatible HTTP face: /{env}/verify and /verify with NeMo-Gym-shaped rows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from cases import ALL_CASES, Case
from reward_support import RewardServer, nemo_request, nemo_response


@pytest.fixture(scope="module")
def http(reward_server: RewardServer) -> httpx.Client:
    with httpx.Client(base_url=reward_server.http_url, timeout=30) as client:
        yield client


def _body(case: Case) -> dict[str, Any]:
    row = json.loads(case.row) if isinstance(case.row, str) else dict(case.row)
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        **row,
        "response": nemo_response(case.text, output_tokens=case.num_tokens or None),
    }


# Every table case that is expressible as a JSON body (the row_json-level ones are gRPC-only).
HTTP_CASES = [
    pytest.param(env, c, id=f"{env}-{c.id}")
    for env, cases in ALL_CASES.items()
    for c in cases
    if not isinstance(c.row, str)
]


@pytest.mark.parametrize(("env", "case"), HTTP_CASES)
def test_case_over_http(http: httpx.Client, env: str, case: Case) -> None:
    body = _body(case)
    reply = http.post(f"/{env}/verify", json=body)
    if case.invalid_field is not None:
        assert reply.status_code == 422, reply.text
        field = case.invalid_field.removeprefix("row.")
        assert reply.json()["field"] == field
        assert reply.json()["detail"][0]["loc"] == ["body", *field.split(".")]
        return
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["reward"] == pytest.approx(case.reward)
    assert sum(data["reward_components"].values()) == pytest.approx(data["reward"])
    assert (
        data["failure_kind"] is None
        and data["failure_reason"] is None
        and data["mask_sample"] is False
    )
    for key, value in body.items():  # the request comes back unchanged
        assert data[key] == value


def test_nemo_gym_math_row_unchanged(http: httpx.Client) -> None:
    """A row as NeMo-Gym's math resources server receives it (agent_ref, extra metadata)."""
    body = nemo_request(
        "What is 1/2 + 1/4?",
        nemo_response(r"We add: \boxed{\frac{3}{4}}", reasoning="1/2=2/4", output_tokens=42),
        question="What is 1/2 + 1/4?",
        expected_answer="0.75",
        agent_ref={"type": "responses_api_agents", "name": "math"},
        uuid="abc-1",
    )
    reply = http.post("/verify", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["reward"] == 1.0 and data["reward_components"] == {"correctness": 1.0}
    assert data["uuid"] == "abc-1" and data["agent_ref"] == body["agent_ref"]
    assert data["response"] == body["response"]
    assert data["verifier_info"]["extracted_answer"] == r"\frac{3}{4}"


def test_verify_routes_on_env_field(http: httpx.Client) -> None:
    body = nemo_request(
        "q", nemo_response("Answer: B"), env="mcqa", expected_answer="B", grading_mode="lenient"
    )
    assert http.post("/verify", json=body).json()["reward"] == 1.0


def test_verify_without_env_is_422(http: httpx.Client) -> None:
    reply = http.post("/verify", json=nemo_request("q", nemo_response("1"), expected_answer="1"))
    assert reply.status_code == 422 and reply.json()["field"] == "env"


def test_unknown_env_route_is_422(http: httpx.Client) -> None:
    reply = http.post(
        "/nope/verify", json=nemo_request("q", nemo_response("1"), expected_answer="1")
    )
    assert reply.status_code == 422 and reply.json()["field"] == "env"


def test_function_call_items_reach_tool_use(http: httpx.Client) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    body = nemo_request(
        "Weather?",
        nemo_response("", function_calls=[call]),
        expected_tool_call={"name": "get_weather", "arguments": {"city": "Paris"}},
    )
    data = http.post("/tool_use/verify", json=body).json()
    assert data["reward"] == 1.0 and data["verifier_info"]["called"] == "get_weather"


def test_reasoning_in_message_text_is_stripped(http: httpx.Client) -> None:
    text = r"<think>\boxed{3}</think>\boxed{4}"
    body = nemo_request("q", nemo_response(text), expected_answer="4", extraction="lenient")
    assert http.post("/math/verify", json=body).json()["reward"] == 1.0
    # NeMo-Gym's math server reads the <think> part too: math-verify sees {3, 4}, not 4.
    body = nemo_request("q", nemo_response(text), expected_answer="4")
    assert http.post("/math/verify", json=body).json()["reward"] == 0.0


def test_usage_tokens_feed_low_effort(http: httpx.Client) -> None:
    body = nemo_request(
        "q",
        nemo_response(r"\boxed{4}", output_tokens=500),
        inner_env="math",
        expected_answer="4",
        token_budget=1000,
        length_penalty=0.5,
    )
    data = http.post("/low_effort/verify", json=body).json()
    assert data["reward"] == pytest.approx(0.75)
    assert data["reward_components"] == pytest.approx(
        {"inner:correctness": 1.0, "length_penalty": -0.25}
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"expected_answer": "1"}, "response"),
        ({"expected_answer": "1", "response": "just text"}, "response"),
        ({"expected_answer": "1", "response": {"output": "x"}}, "response.output"),
        ({"expected_answer": "1", "response": {"output": [3]}}, "response.output[0]"),
        (
            {"expected_answer": "1", "response": {"output": [{"type": "message", "content": 5}]}},
            "response.output[0].content",
        ),
        (
            {"expected_answer": "1", "response": {"output": [], "usage": {"output_tokens": -1}}},
            "response.usage.output_tokens",
        ),
        ({"response": {"output": []}}, "expected_answer"),
    ],
)
def test_malformed_bodies_are_422(http: httpx.Client, body: dict[str, Any], field: str) -> None:
    reply = http.post("/math/verify", json=body)
    assert reply.status_code == 422, reply.text
    assert reply.json()["field"] == field


def test_non_json_body_is_422(http: httpx.Client) -> None:
    reply = http.post(
        "/math/verify", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert reply.status_code == 422 and "not valid JSON" in reply.json()["detail"][0]["msg"]


def test_seed_session_and_environments(http: httpx.Client) -> None:
    assert http.post("/math/seed_session", json={}).json() == {}
    assert http.post("/nope/seed_session", json={}).status_code == 422
    names = {e["name"]: e for e in http.get("/environments").json()}
    assert names["structured_outputs"]["verify_route"] == "/structured_outputs/verify"
    assert names["structured_outputs"]["required_fields"] == ["schema_str"]


def test_metrics_count_results(http: httpx.Client) -> None:
    http.post(
        "/math/verify", json=nemo_request("q", nemo_response(r"\boxed{2}"), expected_answer="2")
    )
    text = http.get("/metrics").text
    assert 'rlfleet_reward_results_total{env="math",outcome="scored"}' in text
    assert 'rlfleet_reward_http_requests_total{env="math",status="200"}' in text
    assert "rlfleet_reward_pool_workers 2.0" in text
