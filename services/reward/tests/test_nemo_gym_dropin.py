"""Drop-in for NeMo-Gym users: NeMo-Gym's own example rows (fixtures/nemo_gym, unedited)
load through `rlfleet data prep` and score through the real gateway (HTTP `/verify` at the
root and per environment, gRPC ScoreGroup), and the routes a NeMo-Gym agent calls
(`/seed_session`, `/verify`, `/aggregate_metrics`, `/reverify_mode`) answer as NeMo-Gym's
resources servers do. Reward *values* are the parity tests' business: here a reward must
be computed (no failure), not right."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from reward_support import RewardServer, nemo_response
from rlfleet_contracts.rows import NEMO_GYM_SERVERS, DataError, env_of
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nemo_gym"

# A response per server: text, and the function calls a tool-calling agent would send.
ANSWERS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    # The row's own answer: a wrong one against example row 2's (2+sqrt 3)^2016 expression
    # runs the math verifier into its timeout (a failure, reported to the parity work).
    "math_with_judge": ("So it is \\boxed{%(expected_answer)s}.", []),
    "mcqa": ("The test is PCR. \\boxed{B}", []),
    "structured_outputs": ('{"name": "x"}', [{"name": "response_tool_8", "arguments": {}}]),
    "instruction_following": ("Crash. A short story.\n\nIt ends with contest", []),
    "reasoning_gym": ("Zoey is a fool, and Riley is a sage.", []),
    "code_gen": ("```python\nprint(input())\n```", []),
}
# Example rows our environments still refuse; the parity slice of issue 13 owns these
# (mcqa grading modes, IF instruction ids). Remove a server from here once it loads.
NOT_YET: dict[str, str] = {}
"""Servers whose example rows do not load yet, by reason (expected to fail until they do)."""


def servers(refused: dict[str, str]) -> list[Any]:
    return [
        pytest.param(s, marks=[pytest.mark.xfail(reason=refused[s], strict=True)])
        if s in refused
        else s
        for s in ANSWERS
    ]


SERVERS = servers(NOT_YET)


def example_rows(server: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{server}.jsonl").read_text().splitlines()]


def prepared(server: str, row: dict[str, Any]) -> dict[str, Any]:
    """The row as `ng_prepare_data` 0.7 writes it: routed by `task_source`, the agent
    instance's name (nemo_gym/train_data_utils.py strips a legacy agent_ref)."""
    agent = NEMO_GYM_SERVERS[server][1][0]
    return {**{k: v for k, v in row.items() if k != "agent_ref"}, "task_source": agent}


def answer(server: str, row: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    text, calls = ANSWERS[server]
    return (text % row if server == "math_with_judge" else text), calls


def verify_body(server: str, row: dict[str, Any]) -> dict[str, Any]:
    text, calls = answer(server, row)
    return {**row, "response": nemo_response(text, function_calls=calls, output_tokens=7)}


def assert_scored(data: dict[str, Any]) -> None:
    assert data["failure_kind"] is None, data["failure_reason"]
    assert data["mask_sample"] is False
    assert 0.0 <= data["reward"] <= 1.0


@pytest.fixture(scope="module")
def http(reward_server: RewardServer) -> httpx.Client:
    with httpx.Client(base_url=reward_server.http_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("server", SERVERS)
def test_prepared_rows_load_through_data_prep(server: str, tmp_path: Path) -> None:
    blend = tmp_path / f"{server}.jsonl"
    blend.write_text("".join(json.dumps(prepared(server, r)) + "\n" for r in example_rows(server)))
    out, manifest = prepare_rl(str(blend), PrepOptions(out=tmp_path / "out", val_rows=1))
    env = NEMO_GYM_SERVERS[server][0]
    assert manifest.options["row_check"] == "reward environments"
    assert manifest.splits["train"]["env_mix"] == {env: 1}
    assert manifest.splits["val"]["env_mix"] == {env: 1}
    rows = [json.loads(x) for x in (out / "train" / "data.jsonl").read_text().splitlines()]
    assert rows[0]["env"] == env and rows[0]["task_source"] == prepared(server, {})["task_source"]


@pytest.mark.parametrize("server", SERVERS)
def test_raw_example_file_loads_with_a_default_env(server: str, tmp_path: Path) -> None:
    # The file exactly as NeMo-Gym ships it: routing lives in NeMo-Gym's config, not the row.
    source = FIXTURES / f"{server}.jsonl"
    env = NEMO_GYM_SERVERS[server][0]
    options = PrepOptions(out=tmp_path / "out", val_rows=1, default_env=env)
    _, manifest = prepare_rl(str(source), options)
    assert manifest.splits["train"]["env_mix"] == {env: 1}


def test_raw_rows_without_an_env_are_refused_line_by_line(tmp_path: Path) -> None:
    source = FIXTURES / "math_with_judge.jsonl"
    with pytest.raises(DataError) as info:
        prepare_rl(str(source), PrepOptions(out=tmp_path, val_rows=1))
    message = str(info.value)
    assert message.startswith("2 problem(s)")
    assert f"{source}:1: env: missing" in message and f"{source}:2: env: missing" in message


@pytest.mark.parametrize("server", SERVERS)
def test_example_rows_score_over_http(http: httpx.Client, server: str) -> None:
    env = NEMO_GYM_SERVERS[server][0]
    for row in example_rows(server):
        routed = prepared(server, row)
        for path, body in (
            ("/verify", verify_body(server, routed)),  # root: routed by the agent name
            (f"/{env}/verify", verify_body(server, row)),  # per environment, raw row
            (f"/{server}/verify", verify_body(server, row)),  # NeMo-Gym's server name
        ):
            reply = http.post(path, json=body)
            assert reply.status_code == 200, (path, reply.text)
            assert_scored(reply.json())


@pytest.mark.parametrize("server", SERVERS)
def test_example_rows_score_over_grpc(stub: reward_pb2_grpc.RewardServiceStub, server: str) -> None:
    for row in example_rows(server):
        text, calls = answer(server, row)
        text = text or "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
        request = reward_pb2.ScoreGroupRequest(
            request_id="ng",
            env=env_of(prepared(server, row)),
            row_json=json.dumps(row),
            responses=[reward_pb2.Response(text=text, num_tokens=7)] * 2,
        )
        reply = stub.ScoreGroup(request, timeout=60)
        for result in reply.results:
            assert result.failure_kind == 0, result.failure_reason  # FailureKind NONE
            assert 0.0 <= result.reward <= 1.0


def test_grpc_accepts_a_nemo_gym_agent_name_as_env(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    row = example_rows("math_with_judge")[0]
    request = reward_pb2.ScoreRequest(
        env="math_with_judge_simple_agent",
        row_json=json.dumps(row),
        response=reward_pb2.Response(text="\\boxed{32}"),
    )
    result = stub.Score(request, timeout=60)
    assert result.failure_kind == 0 and result.reward == 1.0


def test_unknown_agent_name_is_refused_naming_the_field(http: httpx.Client) -> None:
    row = {**example_rows("math_with_judge")[0], "agent_ref": {"name": "wordle_simple_agent"}}
    reply = http.post("/verify", json=verify_body("math_with_judge", row))
    assert reply.status_code == 422
    assert reply.json()["field"] == "agent_ref.name"
    message = reply.json()["detail"][0]["msg"]
    assert "'wordle_simple_agent'" in message and "math_with_judge_simple_agent" in message
