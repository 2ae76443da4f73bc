"""long_context, multi_challenge, math_with_code and math_formal_lean: their tables of
cases in-process and through the real gateway (gRPC Score and the NeMo-Gym HTTP face),
the Lean refusal, and the math_with_code tool routes' refusals (the tool itself runs
against the real sandbox in tests/test_reward_math_with_code.py at the repo root)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cases import Case
from new_env_cases import NEW_CASES
from reward_support import RewardServer, check_case_over_grpc, nemo_response, score_request
from rlfleet_proto.v1 import reward_pb2_grpc
from rlfleet_reward.environments import ENVIRONMENT_NAMES, get_environment
from rlfleet_reward.environments.math_formal_lean import LEAN_MISSING, LeanUnavailable
from rlfleet_reward.types import FailureKind, RowError, Sample

PARAMS = [
    pytest.param(env, case, id=f"{env}-{case.id}")
    for env, cases in NEW_CASES.items()
    for case in cases
]


def test_the_new_environments_are_registered_with_full_tables() -> None:
    assert {*NEW_CASES, "math_formal_lean"} <= set(ENVIRONMENT_NAMES)
    for env, cases in NEW_CASES.items():
        assert len(cases) >= 10, env
        assert any(c.invalid_field for c in cases), env
        assert any(c.reward == 1.0 for c in cases) and any(c.reward == 0.0 for c in cases), env


@pytest.mark.parametrize(("env", "case"), PARAMS)
def test_case_in_process(env: str, case: Case) -> None:
    environment = get_environment(env)
    row = json.loads(case.row) if isinstance(case.row, str) else case.row
    if case.invalid_field is not None:
        with pytest.raises(RowError) as err:
            environment.parse_row(row)
        assert err.value.field == case.invalid_field.removeprefix("row."), err.value
        return
    score = environment.score(environment.parse_row(row), Sample(case.text))
    assert score.reward == pytest.approx(case.reward), score.info
    assert not score.failed
    for key, value in case.info.items():
        assert score.info[key] == value, score.info


@pytest.mark.parametrize(("env", "case"), PARAMS)
def test_case_over_grpc(stub: reward_pb2_grpc.RewardServiceStub, env: str, case: Case) -> None:
    assert case.failure is FailureKind.NONE  # these environments' cases all score
    check_case_over_grpc(stub, env, case)  # as test_environments_grpc.py checks its tables


@pytest.fixture(scope="module")
def http(reward_server: RewardServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reward_server.http_url, timeout=30) as client:
        yield client


def _body(row: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        **row,
        "response": nemo_response(text),
    }


@pytest.mark.parametrize(("env", "case"), PARAMS)
def test_case_over_http(http: httpx.Client, env: str, case: Case) -> None:
    assert isinstance(case.row, dict)
    reply = http.post(f"/{env}/verify", json=_body(case.row, case.text))
    if case.invalid_field is not None:
        assert reply.status_code == 422, reply.text
        assert reply.json()["field"] == case.invalid_field.removeprefix("row.")
        return
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == pytest.approx(case.reward)


_LEAN_ROW = {
    "header": "import Mathlib\n\n",
    "formal_statement": "theorem t (x : ℕ) : x + 0 = x := by\n",
    "informal_prefix": "/-- x + 0 = x -/\n",
    "name": "t",
}
_LEAN_PROOF = "```lean4\ntheorem t (x : ℕ) : x + 0 = x := by\n  simp\n```"


def test_lean_is_refused_with_the_reason_over_grpc(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request("math_formal_lean", _LEAN_ROW, _LEAN_PROOF), timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == f"env: {LEAN_MISSING}"
    assert "Lean 4" in LEAN_MISSING and "To enable it" in LEAN_MISSING


def test_lean_is_refused_with_the_reason_over_http(http: httpx.Client) -> None:
    reply = http.post("/math_formal_lean/verify", json=_body(_LEAN_ROW, _LEAN_PROOF))
    assert reply.status_code == 422, reply.text
    assert reply.json()["field"] == "env"
    assert reply.json()["detail"][0]["msg"] == LEAN_MISSING


@pytest.mark.parametrize("missing", ["header", "formal_statement"])
def test_lean_rows_are_checked_before_the_refusal(
    stub: reward_pb2_grpc.RewardServiceStub, missing: str
) -> None:
    row = {k: v for k, v in _LEAN_ROW.items() if k != missing}
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request("math_formal_lean", row, _LEAN_PROOF), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"row.{missing}:")


@pytest.mark.parametrize(
    ("headers", "body", "status", "field"),
    [
        ({"x-session-id": "a b"}, {"code": "print(1)"}, 422, "x-session-id"),
        ({"x-session-id": "ep-1"}, {}, 422, "code"),
        ({"x-session-id": "ep-1"}, {"code": 5}, 422, "code"),
        ({"x-session-id": "ep-1"}, [1], 422, ""),
        ({"x-session-id": "ep-1"}, {"code": "x" * 100_001}, 422, "code"),
    ],
)
def test_tool_route_refuses_malformed_calls(
    http: httpx.Client, headers: dict[str, str], body: Any, status: int, field: str
) -> None:
    reply = http.post("/math_with_code/execute_python", json=body, headers=headers)
    assert reply.status_code == status, reply.text
    assert reply.json()["field"] == field


def test_tool_route_answers_503_when_the_sandbox_has_no_sessions(http: httpx.Client) -> None:
    # The suite's sandbox is the test double, which runs one-shot programs only.
    reply = http.post(
        "/math_with_code/execute_python", json={"code": "x = 1"}, headers={"x-session-id": "ep"}
    )
    assert reply.status_code == 503, reply.text
    assert "CreateSession" in reply.json()["detail"]


_NEMO_GYM_SRC = os.environ.get("RLFLEET_NEMO_GYM_SRC")


def _example_rows(server: str) -> list[dict[str, Any]]:
    if not _NEMO_GYM_SRC:
        pytest.skip("set RLFLEET_NEMO_GYM_SRC to NeMo-Gym's sources to read its example rows")
    path = Path(_NEMO_GYM_SRC) / "resources_servers" / server / "data" / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_nemo_gym_math_with_code_example_rows_load_and_score() -> None:
    env = get_environment("math_with_code")
    verdicts = []
    for row in _example_rows("math_with_code"):
        boxed = f"\\boxed{{{row['expected_result']}}}"
        verdicts.append(env.score(env.parse_row(row), Sample(boxed)).info["verdict"])
    assert verdicts == ["correct"] * 5


def test_nemo_gym_lean_example_rows_pass_the_row_check_and_are_refused() -> None:
    env = get_environment("math_formal_lean")
    for row in _example_rows("math_formal_lean"):
        with pytest.raises(LeanUnavailable):
            env.parse_row(row)


def test_nemo_gym_multichallenge_rows_parse_as_judged_items() -> None:
    env = get_environment("multi_challenge")
    for row in _example_rows("multichallenge"):
        spec = env.parse_row(row)
        assert [item.question for item in spec.items] == [r["question"] for r in row["rubric"]]
        assert spec.conversation
