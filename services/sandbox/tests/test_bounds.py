"""Hostile requests: NaN, lone surrogates, huge and endless bodies, calls that would
wait forever. Each gets a clear 4xx/5xx naming its cause, never a crash or a hang."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.config import LimitsConfig, PoolConfig
from sandbox_testlib import Harness, make_config, serving


async def test_nan_timeout_is_refused_on_both_faces(sandbox: Harness) -> None:
    response = await sandbox.http.post(
        "/execute",
        content=b'{"generated_code": "print(1)", "timeout": NaN, "language": "python3"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith("timeout: must be >= 0")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await sandbox.run("print(1)", timeout_s=float("nan"))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith("limits.timeout_s: must be >= 0")
    with pytest.raises(grpc.aio.AioRpcError) as idle:
        await sandbox.stub.CreateSession(
            sandbox_pb2.CreateSessionRequest(idle_timeout_s=float("nan"))
        )
    assert idle.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await sandbox.assert_healthy()


async def test_lone_surrogate_is_a_400_naming_the_field(sandbox: Harness) -> None:
    for field in ("std_input", "generated_code"):
        body = {"generated_code": "print(1)", "language": "python3", field: "a\ud800b"}
        response = await sandbox.http.post(
            "/execute", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, response.text
        assert response.json()["detail"].startswith(f"{field}: is not valid Unicode")
    await sandbox.assert_healthy()


async def test_bad_json_and_bad_fields(sandbox: Harness) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for raw, code in ((b"{not json", 400), (deep.encode(), 400), (b'{"timeout": 1}', 422)):
        response = await sandbox.http.post(
            "/execute", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == code, response.text
        assert response.json()["process_status"] == "failed"
    typed = await sandbox.http.post("/execute", json={"generated_code": "1", "timeout": "soon"})
    assert typed.status_code == 422 and typed.json()["detail"].startswith("timeout:")


async def test_body_size_limit_holds_with_and_without_content_length() -> None:
    async with serving(make_config(http={"max_body_bytes": 64 << 10})) as harness:
        big = {"generated_code": "#" * (100 << 10) + "\nprint(1)", "language": "python3"}
        declared = await harness.http.post("/execute", json=big)
        assert declared.status_code == 413, declared.text
        assert "http.max_body_bytes" in declared.json()["detail"]

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"generated_code": "'
            for _ in range(100):
                yield b"#" * 1024
            yield b'", "language": "python3"}'

        chunked = await harness.http.post(
            "/execute", content=chunks(), headers={"content-type": "application/json"}
        )
        assert chunked.status_code == 413, chunked.text
        small = {"generated_code": "#" * (32 << 10) + "\nprint(1)", "language": "python3"}
        assert (await harness.http.post("/execute", json=small)).json()["stdout"] == "1\n"


async def test_http_calls_end_within_the_server_deadline() -> None:
    """With the only sandbox busy, a second call would wait for it; the server-side
    deadline ends it with 504 instead, and the service keeps serving."""
    async with serving(
        make_config(
            pool=PoolConfig(size=1, kill_grace_s=0.5),
            limits=LimitsConfig(timeout_s=1.0),
            http={"deadline_s": 2.0},
        )
    ) as harness:
        busy = asyncio.create_task(harness.run("import time; time.sleep(30)", timeout_s=5))
        while (await harness.http.get("/health")).json()["pool_idle"] != 0:
            await asyncio.sleep(0.05)  # until the busy run holds the only sandbox
        waiting = await harness.http.post(
            "/execute", json={"generated_code": "print(1)", "language": "python3", "timeout": 1}
        )
        assert waiting.status_code == 504, waiting.text
        assert "http.deadline_s" in waiting.json()["detail"]
        assert (await busy).status == sandbox_pb2.EXEC_STATUS_TIMEOUT  # gRPC: its own 5 s
        after = await harness.http.post(
            "/execute", json={"generated_code": "print(2)", "language": "python3"}
        )
        assert after.json()["stdout"] == "2\n"
