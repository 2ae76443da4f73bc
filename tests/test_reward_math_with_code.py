"""Cross-service: `math_with_code`'s Python tool against the real sandbox service.

Both services run as their own processes on loopback. A scripted episode calls the tool
the way a policy would (POST /math_with_code/execute_python with the episode's
X-Session-ID), reads the results, and ends with a boxed answer that the gateway scores
over HTTP (NeMo-Gym verify shape) and gRPC. State persists within an episode and is
invisible to another, and to another caller that sends the same X-Session-ID; errors and
timeouts come back as tool results, not HTTP errors. More episodes than the sandbox's
per-client quota run at once (each has a sandbox client key of its own).
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
from rlfleet_contracts.sandbox_client import SandboxBusy, SandboxClient, SessionGone
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.python_tool import PythonToolSessions, ToolLimits
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
    """A sandbox whose sessions idle out after 3 s and that holds 2 at once."""
    args = [
        "sessions.max_idle_timeout_s=3",
        "sessions.reap_interval_s=0.2",
        "sessions.max_sessions=2",
    ]
    with _run_services(tmp_path_factory.mktemp("math-with-code-tight"), args) as running:
        yield running


def _tool(
    services: Services, episode: str, code: str, client: httpx.Client | None = None
) -> dict[str, Any]:
    """One tool call of `episode`, by the module's caller (its cookie jar keeps the
    gateway's caller cookie) or by `client`."""
    reply = (client or services.http).post(
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
    # A caller known from its first call on: its client key (a cookie would come back
    # only with the first answer).
    with httpx.Client(
        base_url=str(services.http.base_url),
        timeout=60,
        headers={"x-rlfleet-client-key": secrets.token_urlsafe(32)},
    ) as caller:
        with ThreadPoolExecutor(2) as pool:
            results = list(
                pool.map(lambda code: _tool(services, episode, code, caller), ["a = 1", "b = 2"])
            )
        assert all(r["success"] for r in results), results
        assert _tool(services, episode, "print(a + b)", caller)["stdout"] == "3\n"
        caller.post("/math_with_code/end_session", headers={"x-session-id": episode})


def _end(client: httpx.Client, episode: str | None = None) -> bool:
    headers = {"x-session-id": episode} if episode is not None else {}
    reply = client.post("/math_with_code/end_session", headers=headers)
    assert reply.status_code == 200, reply.text
    existed: bool = reply.json()["existed"]
    return existed


def test_another_caller_sending_the_same_session_id_gets_its_own_episode(
    services: Services,
) -> None:
    """Issue 28 item 6: the X-Session-ID alone named the session, so any caller that knew
    or guessed it ran code in it. Now the episode is (caller, X-Session-ID)."""
    episode = "rollout-0"  # as guessable as it gets
    base = str(services.http.base_url)
    with (
        httpx.Client(base_url=base, timeout=60) as owner,
        httpx.Client(base_url=base, timeout=60) as stranger,
        httpx.Client(
            base_url=base,
            timeout=60,
            headers={"x-rlfleet-client-key": secrets.token_urlsafe(32)},
        ) as keyed,
    ):
        assert _tool(services, episode, "secret = 41", owner)["success"] is True
        for other in (stranger, keyed):
            seen = _tool(services, episode, "print(secret)", other)
            assert seen["success"] is False and "NameError" in seen["error_message"], seen
            assert _tool(services, episode, "secret = 0", other)["success"] is True
        assert owner.cookies.get("rlfleet_tool_caller")  # minted for the owner
        # Nor can another caller end it.
        assert _end(stranger, episode) is True  # its own episode of that name
        assert _tool(services, episode, "print(secret + 1)", owner)["stdout"] == "42\n"
        assert _end(owner, episode) is True and _end(keyed, episode) is True
        bad_key = owner.post(
            "/math_with_code/execute_python",
            json={"code": "1"},
            headers={"x-session-id": episode, "x-rlfleet-client-key": "short"},
        )
        assert bad_key.status_code == 422 and bad_key.json()["field"] == "x-rlfleet-client-key"


def test_nemo_gym_agent_flow_keeps_the_episode_by_its_cookie(services: Services) -> None:
    """NeMo-Gym's simple agent sends no X-Session-ID: it passes on the cookies of the last
    answer (`cookies=api_response.cookies`), so every answer must set the cookie again."""
    url = f"{str(services.http.base_url).rstrip('/')}/math_with_code/execute_python"
    first = httpx.post(url, json={"code": "n = 20"}, timeout=60)
    assert first.status_code == 200 and first.json()["success"] is True
    second = httpx.post(url, json={"code": "n += 1"}, cookies=first.cookies, timeout=60)
    assert second.json()["success"] is True and second.cookies == first.cookies
    third = httpx.post(url, json={"code": "print(n * 2)"}, cookies=second.cookies, timeout=60)
    assert third.json()["stdout"] == "42\n"
    # A call without the cookie is another caller: a fresh episode.
    fresh = httpx.post(url, json={"code": "print(n)"}, timeout=60)
    assert "NameError" in fresh.json()["error_message"]
    bad = httpx.post(url, json={"code": "1"}, cookies={"rlfleet_tool_caller": "x"}, timeout=60)
    assert bad.status_code == 422 and bad.json()["field"] == "rlfleet_tool_caller"
    for cookies in (third.cookies, fresh.cookies):
        ended = httpx.post(
            url.replace("execute_python", "end_session"), cookies=cookies, timeout=60
        )
        assert ended.json() == {"success": True, "existed": True}


def test_more_episodes_at_once_than_the_sandbox_allows_one_client(services: Services) -> None:
    """Issue 28 item 6: every episode's session was the gateway's one sandbox client's,
    so the sandbox's `max_sessions_per_client` (8 by default, as here) capped the whole
    gateway at 8 concurrent episodes. Ten run at once now, each keeping its state."""
    episodes = [f"wide-{i}-{secrets.token_hex(4)}" for i in range(10)]
    _end(services.http, "none")  # the module's caller has its cookie before the burst
    with ThreadPoolExecutor(4) as pool:
        first = list(pool.map(lambda e: _tool(services, e, f"v = {len(e)}"), episodes))
    assert all(r["success"] for r in first), first
    for episode in episodes:  # all ten are open at once: each still has its own state
        assert _tool(services, episode, "print(v)")["stdout"] == f"{len(episode)}\n"
    assert all(_end(services.http, e) for e in episodes)


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
    client = SandboxClient(services.sandbox_target)
    tools = PythonToolSessions(client, ToolLimits(max_episodes=2, idle_timeout_s=1.0))
    try:
        for episode in ("one", "two"):  # never ended
            assert (await tools.execute("caller", episode, "x = 1"))["success"] is True
        with pytest.raises(SandboxBusy):
            await tools.execute("caller", "three", "x = 3")
        await asyncio.sleep(1.5)
        assert (await tools.execute("caller", "three", "print(3)"))["stdout"] == "3\n"
        assert tools.open_episodes == 1
    finally:
        await tools.end("caller", "three")  # "one" and "two" idle out in the sandbox
        await client.close()


async def test_a_session_handle_is_useless_to_another_gateway_client(services: Services) -> None:
    """Each session's sandbox key is HMAC(the client's secret, the handle's label): a
    client with another secret that learns the handle (a log line) reaches nothing."""
    owner = SandboxClient(services.sandbox_target)
    thief = SandboxClient(services.sandbox_target)
    try:
        handle = await owner.create_session(idle_timeout_s=60, timeout_s=10)
        assert (
            await owner.execute("secret = 42", timeout_s=10, session_id=handle)
        ).status.value == "ok"
        with pytest.raises(SessionGone):
            await thief.execute("print(secret)", timeout_s=10, session_id=handle)
        assert await thief.close_session(handle) is False
        with pytest.raises(SessionGone):  # not a handle at all
            await thief.execute("1", timeout_s=10, session_id=handle.split(".")[1])
        kept = await owner.execute("print(secret)", timeout_s=10, session_id=handle)
        assert kept.stdout == "42\n"
        assert await owner.close_session(handle) is True
    finally:
        await owner.close()
        await thief.close()
