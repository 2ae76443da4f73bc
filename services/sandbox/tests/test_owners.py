"""Sessions belong to the client (key) that created them, on both faces; quotas per
client and overall hold."""

from __future__ import annotations

import grpc
import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.client import SandboxClient, new_client_key
from sandbox_testlib import (
    Harness,
    client_http,
    client_stub,
    make_config,
    start_harness,
    stop_harness,
)

OK = sandbox_pb2.EXEC_STATUS_OK


async def test_grpc_session_is_invisible_to_another_client(sandbox: Harness) -> None:
    sid = (await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest())).session_id
    assert len(sid) == 32 and int(sid, 16) >= 0  # 128 random bits, not a counter
    assert (await sandbox.run("secret = 42", session_id=sid)).status == OK
    other = SandboxClient(f"127.0.0.1:{sandbox.running.grpc_port}")
    try:
        assert other.client_key != sandbox.client_key
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON, code="print(secret)", session_id=sid
        )
        with pytest.raises(grpc.aio.AioRpcError) as used:
            await other.execute(request)
        assert used.value.code() == grpc.StatusCode.NOT_FOUND
        assert await other.close_session(sid) is False  # as for an id that never existed
        # Its own session of the same id would be another session, not this one.
    finally:
        await other.close()
    keyless = client_stub(sandbox.running, None)
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await keyless.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    assert anonymous.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-rlfleet-client-key" in (anonymous.value.details() or "")
    # The owner still has it, state intact.
    assert (await sandbox.run("print(secret)", session_id=sid)).stdout == "42\n"
    closed = await sandbox.stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    assert closed.existed


async def test_http_session_is_invisible_to_another_client(sandbox: Harness) -> None:
    def call(code: str) -> dict[str, object]:
        return {"generated_code": code, "language": "ipython", "session_id": "rollout-1"}

    assert (await sandbox.http.post("/execute", json=call("secret = 42"))).status_code == 200
    other = client_http(sandbox.running, new_client_key())
    try:
        assert (await other.get("/sessions")).json() == {"sessions": []}
        assert (await other.delete("/sessions/rollout-1")).status_code == 404
        # The same name from another client is that client's own, fresh session.
        theirs = (await other.post("/execute", json=call("print(secret)"))).json()
        assert "NameError" in theirs["stderr"]
        listed = (await other.get("/sessions")).json()["sessions"]
        assert [s["session_id"] for s in listed] == ["rollout-1"]
        assert (await other.delete("/sessions/rollout-1")).status_code == 200
    finally:
        await other.aclose()
    keyless = client_http(sandbox.running, None)
    try:
        refused = await keyless.get("/sessions")
        assert refused.status_code == 400 and "x-rlfleet-client-key" in refused.json()["detail"]
        stateful = await keyless.post("/execute", json=call("print(secret)"))
        assert stateful.status_code == 400
        # One-shot runs need no key.
        oneshot = await keyless.post("/execute", json={"generated_code": "print(1)"})
        assert oneshot.json()["stdout"] == "1\n"
    finally:
        await keyless.aclose()
    mine = (await sandbox.http.post("/execute", json=call("print(secret)"))).json()
    assert mine["stdout"] == "42\n"
    assert [s["session_id"] for s in (await sandbox.http.get("/sessions")).json()["sessions"]] == [
        "rollout-1"
    ]


async def test_per_client_and_global_session_quotas() -> None:
    harness = await start_harness(
        make_config(sessions={"max_sessions": 3, "max_sessions_per_client": 2})
    )
    second = client_stub(harness.running, new_client_key())
    third_http = client_http(harness.running, new_client_key())
    try:
        for _ in range(2):
            await harness.stub.CreateSession(sandbox_pb2.CreateSessionRequest())
        with pytest.raises(grpc.aio.AioRpcError) as greedy:
            await harness.stub.CreateSession(sandbox_pb2.CreateSessionRequest())
        assert greedy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_sessions_per_client" in (greedy.value.details() or "")
        # Another client still gets a slot: the greedy one could not take them all.
        await second.CreateSession(sandbox_pb2.CreateSessionRequest())
        # Now the global cap is reached for everyone (HTTP face: 429).
        full = await third_http.post(
            "/execute", json={"generated_code": "1", "language": "ipython", "session_id": "x"}
        )
        assert full.status_code == 429 and "sessions.max_sessions" in full.json()["detail"]
        # Per client over HTTP too.
        mine = client_http(harness.running, harness.client_key)
        try:
            over = await mine.post(
                "/execute", json={"generated_code": "1", "language": "ipython", "session_id": "y"}
            )
            assert over.status_code == 429 and "max_sessions_per_client" in over.json()["detail"]
        finally:
            await mine.aclose()
    finally:
        await third_http.aclose()
        await stop_harness(harness)


async def test_keyless_sessions_when_allowed_share_one_owner() -> None:
    harness = await start_harness(make_config(sessions={"allow_keyless": True}))
    keyless = client_http(harness.running, None)
    try:
        body = {"generated_code": "v = 7", "language": "ipython", "session_id": "s"}
        assert (await keyless.post("/execute", json=body)).status_code == 200
        listed = (await keyless.get("/sessions")).json()["sessions"]
        assert [s["session_id"] for s in listed] == ["s"]
        # A keyed client still cannot see the anonymous sessions.
        assert (await harness.http.get("/sessions")).json() == {"sessions": []}
    finally:
        await keyless.aclose()
        await stop_harness(harness)


async def test_bad_client_key_is_refused_naming_the_header(sandbox: Harness) -> None:
    weak = client_http(sandbox.running, "short")
    try:
        response = await weak.get("/sessions")
        assert response.status_code == 400
        assert response.json()["detail"].startswith("x-rlfleet-client-key: use 16-256")
    finally:
        await weak.aclose()
