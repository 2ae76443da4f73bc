"""Sessions belong to the client (key) that created them, on both faces; keyless callers
(NeMo-Skills) have a namespace of their own where the id is the capability; quotas per
client, for keyless callers and overall hold."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from rlfleet_proto.v1 import sandbox_pb2
from sandbox_testlib import (
    Harness,
    client_http,
    client_stub,
    make_config,
    new_client_key,
    serving,
)

OK = sandbox_pb2.EXEC_STATUS_OK


async def test_grpc_session_is_invisible_to_another_client(sandbox: Harness) -> None:
    sid = (await sandbox.stub.CreateSession(sandbox_pb2.CreateSessionRequest())).session_id
    assert len(sid) == 32 and int(sid, 16) >= 0  # 128 random bits, not a counter
    assert (await sandbox.run("secret = 42", session_id=sid)).status == OK
    other = client_stub(sandbox.running, new_client_key())
    request = sandbox_pb2.ExecuteRequest(
        language=sandbox_pb2.LANGUAGE_PYTHON, code="print(secret)", session_id=sid
    )
    with pytest.raises(grpc.aio.AioRpcError) as used:
        await other.Execute(request)
    assert used.value.code() == grpc.StatusCode.NOT_FOUND
    # As for an id that never existed. Its own session of the same id would be another
    # session, not this one.
    closing_other = await other.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    assert closing_other.existed is False
    # A keyless caller knowing the id is in the keyless namespace: the keyed session is
    # not there (NOT_FOUND to use, existed=false to close).
    keyless = client_stub(sandbox.running, None)
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await keyless.Execute(
            sandbox_pb2.ExecuteRequest(
                language=sandbox_pb2.LANGUAGE_PYTHON, code="print(secret)", session_id=sid
            )
        )
    assert anonymous.value.code() == grpc.StatusCode.NOT_FOUND
    closing = await keyless.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    assert closing.existed is False
    # The owner still has it, state intact.
    assert (await sandbox.run("print(secret)", session_id=sid)).stdout == "42\n"
    closed = await sandbox.stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=sid))
    assert closed.existed


async def test_http_session_is_invisible_to_another_client(sandbox: Harness) -> None:
    def call(code: str) -> dict[str, object]:
        return {"generated_code": code, "language": "ipython", "session_id": "rollout-1"}

    assert (await sandbox.http.post("/execute", json=call("secret = 42"))).status_code == 200
    async with client_http(sandbox.running, new_client_key()) as other:
        assert (await other.get("/sessions")).json() == {"sessions": []}
        assert (await other.delete("/sessions/rollout-1")).status_code == 404
        # The same name from another client is that client's own, fresh session.
        theirs = (await other.post("/execute", json=call("print(secret)"))).json()
        assert "NameError" in theirs["stderr"]
        listed = (await other.get("/sessions")).json()["sessions"]
        assert [s["session_id"] for s in listed] == ["rollout-1"]
        assert (await other.delete("/sessions/rollout-1")).status_code == 200
    async with client_http(sandbox.running, None) as keyless:
        # The same name without a key is a keyless session, never the keyed one.
        stateful = (await keyless.post("/execute", json=call("print(secret)"))).json()
        assert "NameError" in stateful["stderr"] and stateful["new_session_created"] is True
        assert (await keyless.delete("/sessions/rollout-1")).status_code == 200  # its own
        oneshot = await keyless.post("/execute", json={"generated_code": "print(1)"})
        assert oneshot.json()["stdout"] == "1\n"
    mine = (await sandbox.http.post("/execute", json=call("print(secret)"))).json()
    assert mine["stdout"] == "42\n"
    assert [s["session_id"] for s in (await sandbox.http.get("/sessions")).json()["sessions"]] == [
        "rollout-1"
    ]


async def test_per_client_and_global_session_quotas() -> None:
    config = make_config(sessions={"max_sessions": 3, "max_sessions_per_client": 2})
    async with (
        serving(config) as harness,
        client_http(harness.running, new_client_key()) as third_http,
    ):
        second = client_stub(harness.running, new_client_key())
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
        async with client_http(harness.running, harness.client_key) as mine:
            over = await mine.post(
                "/execute", json={"generated_code": "1", "language": "ipython", "session_id": "y"}
            )
            assert over.status_code == 429 and "max_sessions_per_client" in over.json()["detail"]


NEMO_SKILLS_FIELDS = {
    "std_input": "",
    "timeout": 10.0,
    "language": "ipython",
    "max_output_characters": 1000,
    "traceback_verbosity": "Plain",
}
"""What NeMo-Skills' LocalSandbox sends besides the code (its `_prepare_request`); the
session id goes in the X-Session-ID header (newer releases) or the body (older ones)."""


async def test_keyless_nemo_skills_session_works_by_default_in_its_own_namespace(
    sandbox: Harness,
) -> None:
    """An unmodified NeMo-Skills client (no client key, a uuid4 session id) keeps state
    between calls with the default config; keyed clients and keyless callers without the
    id cannot reach it, and keyless ids are never listed."""
    sid = str(uuid.uuid4())
    async with (
        client_http(sandbox.running, None) as keyless,
        client_http(sandbox.running, None) as other_keyless,
        client_http(sandbox.running, new_client_key()) as keyed,
    ):

        async def execute(client: Any, code: str, session: str, in_body: bool = False) -> Any:
            body = {"generated_code": code, **NEMO_SKILLS_FIELDS}
            if in_body:
                response = await client.post("/execute", json={**body, "session_id": session})
            else:
                response = await client.post(
                    "/execute", json=body, headers={"X-Session-ID": session}
                )
            assert response.status_code == 200, response.text
            return response.json()

        first = await execute(keyless, "secret = 41", sid)
        assert first["process_status"] == "completed" and first["new_session_created"] is True
        second = await execute(keyless, "secret += 1", sid)
        assert second["new_session_created"] is False
        assert (await execute(keyless, "print(secret)", sid, in_body=True))["stdout"] == "42\n"
        # A keyed client naming the same id gets a session of its own.
        theirs = await execute(keyed, "print(secret)", sid)
        assert "NameError" in theirs["stderr"] and theirs["new_session_created"] is True
        # Another keyless caller with a different id learns nothing from listing.
        listed = (await other_keyless.get("/sessions")).json()
        assert listed["sessions"] == [] and "not listed" in listed["note"]
        other_sid = str(uuid.uuid4())
        guessed = await execute(other_keyless, "print(secret)", other_sid)
        assert "NameError" in guessed["stderr"]
        assert (await other_keyless.delete(f"/sessions/{other_sid}")).status_code == 200
        # NeMo-Skills' delete_session: DELETE /sessions/{id} with the id in the header too.
        deleted = await keyless.delete(f"/sessions/{sid}", headers={"X-Session-ID": sid})
        assert deleted.status_code == 200
        assert (await keyless.delete(f"/sessions/{sid}")).status_code == 404
        # The keyed client's session of that name is untouched by the keyless delete.
        assert (await keyed.delete(f"/sessions/{sid}")).status_code == 200


async def test_keyless_quota_and_opt_out() -> None:
    config = make_config(sessions={"max_keyless_sessions": 1, "max_sessions_per_client": 1})
    async with serving(config) as harness, client_http(harness.running, None) as keyless:
        body = {"generated_code": "1", "language": "ipython"}
        ok = await keyless.post("/execute", json=body, headers={"X-Session-ID": "a" * 8})
        assert ok.status_code == 200
        over = await keyless.post("/execute", json=body, headers={"X-Session-ID": "b" * 8})
        assert over.status_code == 429 and "max_keyless_sessions" in over.json()["detail"]
        # Keyed clients have their own quota beside it.
        mine = await harness.http.post("/execute", json=body, headers={"X-Session-ID": "c"})
        assert mine.status_code == 200
    strict_config = make_config(sessions={"allow_keyless": False})
    async with serving(strict_config) as strict, client_http(strict.running, None) as keyless:
        refused = await keyless.post(
            "/execute", json={"generated_code": "1", "language": "ipython", "session_id": "s"}
        )
        assert refused.status_code == 400 and "x-rlfleet-client-key" in refused.json()["detail"]
        listing = await keyless.get("/sessions")
        assert listing.status_code == 400


async def test_bad_client_key_is_refused_naming_the_header(sandbox: Harness) -> None:
    async with client_http(sandbox.running, "short") as weak:
        response = await weak.get("/sessions")
        assert response.status_code == 400
        assert response.json()["detail"].startswith("x-rlfleet-client-key: use 16-256")
