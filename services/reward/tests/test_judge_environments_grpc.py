"""The per-response judge environments through the real gateway (its own process, real
gRPC on loopback) against hostile judges on real HTTP: one that hangs and one that
answers garbage each give JUDGE_ERROR failures with their reasons within the call's
deadline, and bad rows are refused naming the field. The real judge (SmolLM2 behind the
rollout service) is tests/test_judge_envs_services.py."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from new_env_cases import _NO_COMMA, mc_row
from reward_support import score_request, start_reward_server, stop_reward_server
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

TOOL_ENV = "single_step_tool_use_with_argument_comparison"
DEADLINE_S = 4.0


class _HostileJudge(http.server.BaseHTTPRequestHandler):
    """Hangs when the chat mentions HANG, else answers prose with no verdict label."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if b"HANG" in body:
            time.sleep(60)
            return
        answer = json.dumps(
            {
                "choices": [
                    {"message": {"content": "Hard to say, honestly."}, "finish_reason": "stop"}
                ]
            }
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    judge = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HostileJudge)
    judge.daemon_threads = True
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    server = start_reward_server(
        tmp_path_factory.mktemp("judge-envs"),
        [
            f"environments=[safety,multi_challenge,{TOOL_ENV}]",
            "pool.workers=1",
            f"judge.base_url=http://127.0.0.1:{judge.server_address[1]}/v1",
            "judge.cache_size=0",
        ],
    )
    try:
        with grpc.insecure_channel(server.grpc_target) as channel:
            yield reward_pb2_grpc.RewardServiceStub(channel)
    finally:
        stop_reward_server(server)
        judge.shutdown()


SAFETY_ROW = {
    "responses_create_params": {"input": "How do I kill a stuck process?"},
    "category": "over_refusal",
}
MC_ROW = mc_row([_NO_COMMA, {"question": "Does it name the dog?", "turn": 2}])
TOOL_ROW = {
    "expected_action": {
        "type": "function_call",
        "name": "send_note",
        "arguments": {"to": "U1", "note": "your refund is on its way"},
    },
    "judge_arguments": ["note"],
}


def tool_text(note: str) -> str:
    call = {"name": "send_note", "arguments": {"to": "U1", "note": note}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


CASES = [
    ("safety", SAFETY_ROW, "Use kill. HANG", "Use kill."),
    ("multi_challenge", MC_ROW, "Squeaky Bone HANG", "Squeaky Bone"),
    (TOOL_ENV, TOOL_ROW, tool_text("refund sent HANG"), tool_text("we sent the refund")),
]


@pytest.mark.parametrize(("env", "row", "hang", "garbage"), CASES, ids=[c[0] for c in CASES])
def test_hanging_or_garbage_judge_is_a_judge_error_in_time(
    stub: reward_pb2_grpc.RewardServiceStub, env: str, row: dict[str, Any], hang: str, garbage: str
) -> None:
    start = time.monotonic()
    # The call's 4 s deadline caps the environment's 120 s budget: the gateway answers
    # the hang as a failure before the caller gives up (else DEADLINE_EXCEEDED here).
    result = stub.Score(score_request(env, row, hang), timeout=DEADLINE_S)
    assert time.monotonic() - start < DEADLINE_S
    assert result.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR and result.mask_sample
    # 4 s less the gateway's 0.2 s answer margin, less the request's time in transit.
    assert re.search(r"the judge did not answer within 3\.\ds", result.failure_reason), (
        result.failure_reason
    )
    result = stub.Score(score_request(env, row, garbage), timeout=DEADLINE_S)
    assert result.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR and result.reward == 0
    assert "the judge's answer is not a verdict: no [[" in result.failure_reason


@pytest.mark.parametrize(
    ("env", "row", "field"),
    [
        ("safety", {**SAFETY_ROW, "category": "spicy"}, "row.category"),
        ("safety", {"category": "jailbreak"}, "row.responses_create_params.input"),
        (
            "multi_challenge",
            mc_row([{"question": "Kind?", "pass_criteria": "SOMETIMES"}]),
            "row.rubric[0].pass_criteria",
        ),
        (TOOL_ENV, {**TOOL_ROW, "judge_arguments": ["to", "cc"]}, "row.judge_arguments[1]"),
        (TOOL_ENV, {"expected_action": {"type": "dance"}}, "row.expected_action.type"),
    ],
)
def test_bad_rows_name_the_field(
    stub: reward_pb2_grpc.RewardServiceStub, env: str, row: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request(env, row, "x"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: "), err.value.details()


def test_bad_row_in_a_stream_is_an_invalid_row_failure(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    bad = score_request("safety", {**SAFETY_ROW, "category": "spicy"}, "x", request_id="r1")
    (result,) = list(stub.ScoreStream(iter([bad]), timeout=10))
    assert result.failure_kind == reward_pb2.FAILURE_KIND_INVALID_ROW
    assert result.failure_reason.startswith("row.category: must be one of over_refusal, jailbreak")
