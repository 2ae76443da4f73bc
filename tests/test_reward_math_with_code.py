"""Cross-service: `math_with_code`'s Python tool against the real sandbox service.

Both services run as their own processes on loopback. A scripted episode calls the tool
the way a policy would (POST /math_with_code/execute_python with the episode's
X-Session-ID), reads the results, and ends with a boxed answer that the gateway scores
over HTTP (NeMo-Gym verify shape) and gRPC. State persists within an episode and is
invisible to another; errors and timeouts come back as tool results, not HTTP errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.python_tool import PythonToolSessions, ToolLimits
from rlfleet_reward.sandbox_client import GrpcSandboxClient, SandboxBusy
from support import ports_of, sandbox_and_reward

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")


@dataclass
class Services:
    grpc_target: str
    http: httpx.Client
    sandbox_target: str


@contextlib.contextmanager
def _run_services(tmp: Path, sandbox_args: list[str]) -> Iterator[Services]:
    reward_args = ["--http-port", "0", "environments=[math_with_code]", "pool.workers=1"]
    with sandbox_and_reward(tmp, reward_args, sandbox_args) as (sandbox_target, reward, target):
        http = f"http://127.0.0.1:{ports_of(reward).http}"
        with httpx.Client(base_url=http, timeout=60) as client:
            yield Services(target, client, sandbox_target)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with _run_services(tmp_path_factory.mktemp("math-with-code"), []) as running:
        yield running


@pytest.fixture(scope="module")
def tight_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A sandbox whose sessions idle out after 3 s and that allows 2 per client."""
    args = [
        "sessions.max_idle_timeout_s=3",
        "sessions.reap_interval_s=0.2",
        "sessions.max_sessions_per_client=2",
    ]
    with _run_services(tmp_path_factory.mktemp("math-with-code-tight"), args) as running:
        yield running


def _tool(services: Services, episode: str, code: str) -> dict[str, Any]:
    reply = services.http.post(
        "/math_with_code/execute_python", json={"code": code}, headers={"x-session-id": episode}
    )
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def _episode_response(calls: list[tuple[str, dict[str, Any]]], final: str) -> dict[str, Any]:
    """The Responses object of an episode: each tool call with its output, then the answer."""
    output: list[dict[str, Any]] = []
    for i, (code, result) in enumerate(calls):
        call_id = f"call_{i}"
        output.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "execute_python",
                "arguments": json.dumps({"code": code}),
            }
        )
        output.append(
            {"type": "function_call_output", "call_id": call_id, "output": json.dumps(result)}
        )
    output.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": final}],
        }
    )
    return {"id": "resp_1", "output": output}


def test_scripted_episode_executes_python_and_scores_the_boxed_answer(
    services: Services,
) -> None:
    episode = secrets.token_hex(8)
    first = "import math\nways = math.comb(10, 3)\nprint(ways)"
    result1 = _tool(services, episode, first)
    assert result1["success"] is True and result1["stdout"] == "120\n", result1
    # The session keeps state between calls; a trailing expression is echoed.
    result2 = _tool(services, episode, "ways * 2")
    assert result2["success"] is True and result2["stdout"].strip() == "240", result2
    result3 = _tool(services, episode, "ways / 0")
    assert result3["success"] is False and "ZeroDivisionError" in result3["error_message"]
    assert _tool(services, episode, "print(ways + 1)")["stdout"] == "121\n"  # kept past an error

    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Twice the number of 3-subsets of 10 items?"}]
        },
        "expected_result": "240",
        "expected_code_contains": "",
    }
    calls = [(first, result1), ("ways * 2", result2)]
    for final, reward in ((r"So the answer is \boxed{240}.", 1.0), (r"\boxed{120}", 0.0)):
        body = {**row, "response": _episode_response(calls, final)}
        reply = services.http.post("/math_with_code/verify", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["reward"] == reward, reply.json()
        with grpc.insecure_channel(services.grpc_target) as channel:
            scored = reward_pb2_grpc.RewardServiceStub(channel).Score(
                reward_pb2.ScoreRequest(
                    env="math_with_code",
                    row_json=json.dumps(row),
                    response=reward_pb2.Response(text=final),
                ),
                timeout=60,
            )
        assert scored.failure_kind == 0 and scored.reward == reward, scored.failure_reason

    ended = services.http.post("/math_with_code/end_session", headers={"x-session-id": episode})
    assert ended.status_code == 200 and ended.json() == {"success": True, "existed": True}
    again = services.http.post("/math_with_code/end_session", headers={"x-session-id": episode})
    assert again.json() == {"success": True, "existed": False}
    fresh = _tool(services, episode, "print(ways)")  # a new session: the old state is gone
    assert fresh["success"] is False and "NameError" in fresh["error_message"]


def test_episodes_do_not_share_state(services: Services) -> None:
    one, two = secrets.token_hex(8), secrets.token_hex(8)
    assert _tool(services, one, "secret = 41")["success"] is True
    leaked = _tool(services, two, "print(secret)")
    assert leaked["success"] is False and "NameError" in leaked["error_message"]
    assert _tool(services, one, "print(secret + 1)")["stdout"] == "42\n"


def test_a_cell_that_never_ends_is_a_tool_result_and_the_episode_goes_on(
    services: Services,
) -> None:
    episode = secrets.token_hex(8)
    assert _tool(services, episode, "n = 6")["success"] is True
    stuck = _tool(services, episode, "while True:\n    pass")
    assert stuck["success"] is False and "timed out" in stuck["error_message"], stuck
    after = _tool(services, episode, "print(7 * 6)")
    assert after["success"] is True and after["stdout"] == "42\n", after


def test_concurrent_first_calls_of_an_episode_share_one_session(services: Services) -> None:
    episode = secrets.token_hex(8)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda code: _tool(services, episode, code), ["a = 1", "b = 2"]))
    assert all(r["success"] for r in results), results
    assert _tool(services, episode, "print(a + b)")["stdout"] == "3\n"


def test_an_expired_session_starts_afresh_and_says_so(tight_services: Services) -> None:
    episode = secrets.token_hex(8)
    assert _tool(tight_services, episode, "v = 5")["success"] is True
    time.sleep(5)  # past the sandbox's 3 s idle timeout: it closes the session
    after = _tool(tight_services, episode, "print(v)")
    assert after["success"] is False and "NameError" in after["error_message"], after
    assert after["stderr"].startswith("[tool] the previous session had expired")
    assert _tool(tight_services, episode, "print(6)")["stdout"] == "6\n"
    tight_services.http.post("/math_with_code/end_session", headers={"x-session-id": episode})


def test_session_limits_of_the_sandbox_are_429(tight_services: Services) -> None:
    first, second, third = (secrets.token_hex(8) for _ in range(3))
    assert _tool(tight_services, first, "x = 1")["success"] is True
    assert _tool(tight_services, second, "x = 2")["success"] is True
    refused = tight_services.http.post(
        "/math_with_code/execute_python", json={"code": "x = 3"}, headers={"x-session-id": third}
    )
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert "sessions" in refused.json()["detail"]
    ended = tight_services.http.post("/math_with_code/end_session", headers={"x-session-id": first})
    assert ended.json()["existed"] is True
    assert _tool(tight_services, third, "print(3)")["stdout"] == "3\n"  # a slot is free again


async def test_abandoned_episodes_stop_counting_after_their_idle_timeout(
    services: Services,
) -> None:
    client = GrpcSandboxClient(services.sandbox_target)
    tools = PythonToolSessions(client, ToolLimits(max_episodes=2, idle_timeout_s=1.0))
    try:
        for episode in ("one", "two"):  # never ended
            assert (await tools.execute(episode, "x = 1"))["success"] is True
        with pytest.raises(SandboxBusy):
            await tools.execute("three", "x = 3")
        await asyncio.sleep(1.5)
        assert (await tools.execute("three", "print(3)"))["stdout"] == "3\n"
        assert tools.open_episodes == 1
    finally:
        await tools.end("three")  # "one" and "two" idle out in the sandbox, or end with it
        await client.close()
