"""Concurrency, back-pressure, hung verifiers, worker crashes, ScoreGroup and ScoreStream
against real servers."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import grpc
import httpx
import pytest
from grpc import aio
from reward_support import RewardServer, running_reward_server, score_request
from rlfleet_core.client import check_health
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.types import FailureKind


def _metric(server: RewardServer, name: str) -> float:
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    values = [float(v) for v in re.findall(rf"^{re.escape(name)} (\S+)$", text, flags=re.MULTILINE)]
    return sum(values)


async def test_1000_concurrent_with_10_percent_malformed(reward_server: RewardServer) -> None:
    requests = []
    for i in range(1000):
        if i % 10 == 0:  # malformed: rotate through the ways a row can be bad
            bad = [
                ("math", "{broken", "row_json"),
                ("math", json.dumps({"question": "q"}), "row.expected_answer"),
                ("nope", "{}", "env"),
                ("structured_outputs", json.dumps({"schema_str": "{x"}), "row.schema_str"),
            ]
            env, row_json, field = bad[(i // 10) % len(bad)]
            requests.append(
                (reward_pb2.ScoreRequest(request_id=str(i), env=env, row_json=row_json), field)
            )
        elif i % 2:
            a, b = i % 97, i % 89 + 1
            requests.append(
                (
                    score_request(
                        "math",
                        {"expected_answer": f"\\frac{{{a}}}{{{b}}}"},
                        rf"\boxed{{{a / b if i % 3 else a + 1}}}",
                        request_id=str(i),
                    ),
                    None,
                )
            )
        else:
            row = {"schema_str": json.dumps({"type": "object", "required": ["id"]})}
            requests.append(
                (
                    score_request(
                        "structured_outputs",
                        row,
                        json.dumps({"id": i}) if i % 4 else "[]",
                        request_id=str(i),
                    ),
                    None,
                )
            )
    async with aio.insecure_channel(reward_server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def call(
            request: reward_pb2.ScoreRequest,
        ) -> reward_pb2.ScoreResult | grpc.StatusCode:
            try:
                return await stub.Score(request, timeout=120)
            except aio.AioRpcError as exc:
                return exc.code()

        start = time.perf_counter()
        answers = await asyncio.gather(*(call(r) for r, _ in requests))
        elapsed = time.perf_counter() - start
    outcomes: Counter[str] = Counter()
    for (request, bad_field), answer in zip(requests, answers, strict=True):
        if bad_field is not None:
            assert answer == grpc.StatusCode.INVALID_ARGUMENT, (request.request_id, answer)
            outcomes["invalid"] += 1
        else:
            assert isinstance(answer, reward_pb2.ScoreResult), (request.request_id, answer)
            assert answer.request_id == request.request_id
            assert answer.failure_kind == FailureKind.NONE.value, answer.failure_reason
            assert sum(answer.reward_components.values()) == pytest.approx(answer.reward)
            outcomes["scored"] += 1
    assert outcomes == {"scored": 900, "invalid": 100}, outcomes
    assert elapsed < 100
    assert check_health(reward_server.grpc_target) == "SERVING"
    assert httpx.get(f"{reward_server.http_url}/healthz", timeout=5).status_code == 200


async def test_1000_concurrent_http_with_10_percent_malformed(reward_server: RewardServer) -> None:
    # aiohttp, as NeMo-Gym's agents use; 200 connections, so requests really overlap.
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(
        reward_server.http_url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as client:

        async def post(i: int) -> int:
            response = {
                "output": [
                    {
                        "type": "message",
                        "content": [{"type": "output_text", "text": f"Answer: {'ABCD'[i % 4]}"}],
                    }
                ]
            }
            body = (
                {"expected_answer": "B", "grading_mode": "lenient", "response": response}
                if i % 10
                else {"response": response}
            )
            async with client.post("/mcqa/verify", json=body) as reply:
                data = await reply.json()
                if reply.status == 200:
                    assert data["reward"] == (1.0 if i % 4 == 1 else 0.0)
                    assert data["failure_kind"] is None
                else:
                    assert data["field"] == "expected_answer"
                return reply.status

        codes = Counter(await asyncio.gather(*(post(i) for i in range(1000))))
    assert codes == {200: 900, 422: 100}
    assert httpx.get(f"{reward_server.http_url}/healthz", timeout=5).status_code == 200


def test_pathological_math_is_answered_within_deadline(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    """A power tower used to hang sympy until the worker was killed (TIMEOUT); the math env
    now refuses it before parsing (environments/answer_limits.py). A verifier stuck in C
    code is still killed: test_hung_verifier_is_killed_and_pool_recovers."""
    start = time.perf_counter()
    result = stub.Score(
        score_request("math", {"expected_answer": "5"}, r"\boxed{9^{9^{9^{9}}}}"), timeout=3.0
    )
    elapsed = time.perf_counter() - start
    assert FailureKind(result.failure_kind) is FailureKind.NONE, result
    assert result.reward == 0.0 and result.info["verdict"] == "answer_too_complex"
    assert elapsed < 3.0
    ok = stub.Score(score_request("math", {"expected_answer": "5"}, r"\boxed{5}"), timeout=10)
    assert ok.reward == 1.0


def test_hung_verifier_is_killed_and_pool_recovers(
    reward_server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    restarts = _metric(reward_server, 'rlfleet_reward_pool_restarts_total{reason="timeout"}')
    start = time.perf_counter()
    result = stub.Score(score_request("hang", {}, "hang"), timeout=3.0)
    elapsed = time.perf_counter() - start
    assert FailureKind(result.failure_kind) is FailureKind.TIMEOUT
    assert "killed and replaced" in result.failure_reason
    assert elapsed < 3.0
    deadline = time.monotonic() + 10  # the replacement is started after the answer
    while (
        _metric(reward_server, 'rlfleet_reward_pool_restarts_total{reason="timeout"}')
        < restarts + 1
    ):
        assert time.monotonic() < deadline, "no worker restart counted"
        time.sleep(0.1)
    assert (
        _metric(reward_server, 'rlfleet_reward_pool_restarts_total{reason="timeout"}')
        == restarts + 1
    )
    assert [stub.Score(score_request("hang", {}, "fine"), timeout=10).reward for _ in range(8)] == [
        1.0
    ] * 8
    assert (
        stub.Score(score_request("math", {"expected_answer": "2"}, r"\boxed{2}"), timeout=10).reward
        == 1.0
    )


def test_crashing_verifier_is_a_verifier_error(
    reward_server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    result = stub.Score(score_request("crash", {}, "crash"), timeout=10)
    assert FailureKind(result.failure_kind) is FailureKind.VERIFIER_ERROR
    assert "exit code 3" in result.failure_reason
    assert all(
        stub.Score(score_request("crash", {}, "fine"), timeout=10).reward == 1.0 for _ in range(4)
    )


def test_deadline_too_short_to_verify(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    """Either the client's deadline fires first, or the gateway answers an explicit TIMEOUT:
    never a reward."""
    try:
        result = stub.Score(
            score_request("math", {"expected_answer": "5"}, r"\boxed{5}"), timeout=0.001
        )
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    else:
        assert FailureKind(result.failure_kind) is FailureKind.TIMEOUT and result.mask_sample


def test_score_group(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    texts = [r"\boxed{4}", r"\boxed{5}", "no idea", r"\boxed{\frac{8}{2}}"]
    request = reward_pb2.ScoreGroupRequest(
        request_id="g1",
        env="math",
        row_json=json.dumps({"expected_answer": "4"}),
        responses=[reward_pb2.Response(text=t) for t in texts],
    )
    reply = stub.ScoreGroup(request, timeout=30)
    assert reply.request_id == "g1"
    assert [r.reward for r in reply.results] == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(grpc.RpcError) as err:
        stub.ScoreGroup(
            reward_pb2.ScoreGroupRequest(
                env="math", row_json="{}", responses=[reward_pb2.Response()]
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("row.expected_answer:")
    with pytest.raises(grpc.RpcError) as err:
        stub.ScoreGroup(
            reward_pb2.ScoreGroupRequest(env="math", row_json='{"expected_answer": "1"}'),
            timeout=10,
        )
    assert err.value.details().startswith("responses:")


def test_score_group_low_effort_needs_tokens_per_response(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    row = json.dumps({"inner_env": "math", "expected_answer": "1", "token_budget": 10})
    request = reward_pb2.ScoreGroupRequest(
        env="low_effort",
        row_json=row,
        responses=[
            reward_pb2.Response(text=r"\boxed{1}", num_tokens=5),
            reward_pb2.Response(text=r"\boxed{1}"),
        ],
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.ScoreGroup(request, timeout=10)
    assert err.value.details().startswith("responses[1].num_tokens:")


async def test_score_stream_mixed(reward_server: RewardServer) -> None:
    items = [
        score_request("math", {"expected_answer": str(i)}, rf"\boxed{{{i}}}", request_id=f"ok{i}")
        for i in range(40)
    ]
    items += [
        reward_pb2.ScoreRequest(request_id="bad-json", env="math", row_json="{"),
        reward_pb2.ScoreRequest(request_id="bad-env", env="zzz", row_json="{}"),
        score_request("math", {"expected_answer": "1"}, r"\boxed{2}", request_id="wrong"),
    ]

    async def feed() -> AsyncIterator[reward_pb2.ScoreRequest]:
        for item in items:
            yield item

    async with aio.insecure_channel(reward_server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        results = {r.request_id: r async for r in stub.ScoreStream(feed(), timeout=60)}
    assert len(results) == len(items)
    assert all(results[f"ok{i}"].reward == 1.0 for i in range(40))
    assert results["wrong"].reward == 0.0 and results["wrong"].failure_kind == 0
    for rid, field in (("bad-json", "row_json"), ("bad-env", "env")):
        assert FailureKind(results[rid].failure_kind) is FailureKind.INVALID_ROW
        assert results[rid].failure_reason.startswith(f"{field}:") and results[rid].mask_sample


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    """One worker, a queue of 4: easy to overload."""
    with running_reward_server(
        tmp_path_factory.mktemp("small"),
        [
            "environments=[math]",
            "pool.workers=1",
            "pool.max_queue=4",
            "extra_environments={hang: reward_test_envs:HangEnvironment}",
            "pool.kill_grace_s=0.3",
        ],
        name="small",
    ) as server:
        yield server


async def test_overload_gives_resource_exhausted(small_server: RewardServer) -> None:
    async with aio.insecure_channel(small_server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def call(i: int) -> grpc.StatusCode:
            try:
                # A slow-ish job (the hang env's fast path still costs a round trip).
                await stub.Score(
                    score_request("math", {"expected_answer": "(x+1)^2"}, rf"\boxed{{x^2+2x+{i}}}"),
                    timeout=60,
                )
                return grpc.StatusCode.OK
            except aio.AioRpcError as exc:
                assert exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "queue full" in (
                    exc.details() or ""
                )
                return exc.code()

        codes = Counter(await asyncio.gather(*(call(i) for i in range(40))))
    assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] > 0, codes
    assert codes[grpc.StatusCode.OK] >= 5, codes
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    reply = httpx.post(
        f"{small_server.http_url}/math/verify",
        timeout=30,
        json={"expected_answer": "1", "response": {"output": []}},
    )
    assert reply.status_code == 200 and reply.json()["reward"] == 0.0
    text = httpx.get(f"{small_server.http_url}/metrics", timeout=10).text
    assert re.search(
        r'^rlfleet_reward_rejected_total\{reason="overloaded"\} [1-9]', text, flags=re.MULTILINE
    )


def test_unserved_environment_is_refused(small_server: RewardServer) -> None:
    with grpc.insecure_channel(small_server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(score_request("mcqa", {"expected_answer": "A"}, "A"), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not enabled here" in err.value.details()
        listed = stub.ListEnvironments(reward_pb2.ListEnvironmentsRequest(), timeout=10)
        # Score's environments are exactly the enabled ones (the multi-turn ones of
        # `episodes.environments` are listed too, marked multi_turn).
        assert [e.name for e in listed.environments if not e.multi_turn] == ["math", "hang"]


def test_server_log_is_clean(reward_server: RewardServer, tmp_path: Path) -> None:
    assert "Traceback" not in reward_server.log()


async def test_job_queued_behind_a_hung_one_is_rerun(small_server: RewardServer) -> None:
    """One worker: the second job waits in the worker's pipe behind the hung one; when the
    worker is killed it must run on the replacement, not be lost."""
    async with aio.insecure_channel(small_server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        hung = asyncio.ensure_future(stub.Score(score_request("hang", {}, "hang"), timeout=2.0))
        await asyncio.sleep(0.2)
        behind = [
            asyncio.ensure_future(stub.Score(score_request("hang", {}, "fine"), timeout=20))
            for _ in range(3)
        ]
        first = await hung
        rest = await asyncio.gather(*behind)
    assert (
        FailureKind(first.failure_kind) is FailureKind.TIMEOUT and "killed" in first.failure_reason
    )
    assert [r.reward for r in rest] == [1.0, 1.0, 1.0]
    assert all(r.failure_kind == 0 for r in rest)
