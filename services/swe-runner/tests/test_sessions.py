"""Agent mode through the real service and docker: a scripted agent opens a session on a
bundled instance, looks around with bash and view, fixes the bug with edit, submits, and
the submitted patch resolves the instance under Evaluate; plus ownership, the per-command
time limit, the idle timeout, the session limit and bad calls."""

from __future__ import annotations

import asyncio
import secrets

import grpc
import pytest
from grpc import aio
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from swe_testlib import instances, labelled, request_for

INSTANCE = {i.instance_id: i for i in instances()}["rlfleet__tinystats-1"]
KEY = (("x-rlfleet-client-key", "k" * 8 + secrets.token_hex(8)),)
OTHER = (("x-rlfleet-client-key", "o" * 8 + secrets.token_hex(8)),)
SESSIONS = ["sessions.max_sessions=3", "sessions.max_sessions_per_client=2", "sessions.reap_interval_s=0.5",
            "sessions.command_timeout_s=20"]  # fmt: skip


@pytest.fixture
def service_overrides() -> list[str]:
    """Session limits for conftest's `stub` service: small enough to reach."""
    return SESSIONS


async def open_session(
    stub: swe_pb2_grpc.SweRunnerServiceStub,
    metadata: tuple[tuple[str, str], ...] = KEY,
    **kw: object,
) -> str:
    request = swe_pb2.SweOpenSessionRequest(
        instance_id=INSTANCE.instance_id, image=INSTANCE.image, workdir=INSTANCE.workdir,
        base_commit=INSTANCE.base_commit, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    reply = await stub.OpenSweSession(request, metadata=metadata, timeout=60)
    return reply.session_id


async def tool(
    stub: swe_pb2_grpc.SweRunnerServiceStub, session: str, **kw: object
) -> swe_pb2.SweRunToolReply:
    request = swe_pb2.SweRunToolRequest(session_id=session, **kw)  # type: ignore[arg-type]
    return await stub.RunSweTool(request, metadata=KEY, timeout=60)


async def test_scripted_agent_fixes_the_bug(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    session = await open_session(stub)
    found = await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH, command="grep -rn 'def median' .")
    assert found.exit_code == 0 and "tinystats/core.py" in found.output
    viewed = await tool(stub, session, tool=swe_pb2.SWE_TOOL_VIEW, path="tinystats/core.py")
    assert "return ordered[len(ordered) // 2]" in viewed.output and not viewed.error
    missing = await tool(stub, session, tool=swe_pb2.SWE_TOOL_EDIT, path="tinystats/core.py",
                         old_str="no such text", new_str="x")  # fmt: skip
    assert missing.error and "occurs 0 times" in missing.output
    gold_lines = [
        line[1:]
        for line in INSTANCE.patch.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    edited = await tool(
        stub, session, tool=swe_pb2.SWE_TOOL_EDIT, path="tinystats/core.py",
        old_str="    return ordered[len(ordered) // 2]\n", new_str="\n".join(gold_lines) + "\n",
    )  # fmt: skip
    assert not edited.error, edited.output
    submitted = await tool(stub, session, tool=swe_pb2.SWE_TOOL_SUBMIT)
    assert not submitted.error, submitted.output
    assert submitted.patch.startswith("diff --git a/tinystats/core.py")
    await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)
    result = await stub.Evaluate(request_for(INSTANCE, submitted.patch), timeout=180)
    assert result.resolved, result.log_tail


async def test_sessions_belong_to_their_key(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    session = await open_session(stub)
    request = swe_pb2.SweRunToolRequest(
        session_id=session, tool=swe_pb2.SWE_TOOL_BASH, command="id"
    )
    with pytest.raises(aio.AioRpcError) as info:
        await stub.RunSweTool(request, metadata=OTHER, timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(aio.AioRpcError) as info:
        await stub.RunSweTool(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("x-rlfleet-client-key:")
    reply = await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH, command="id -u")
    assert reply.output.strip() == "1000"  # the image's unprivileged user, not root
    await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)


async def test_command_time_limit_and_no_network(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    session = await open_session(stub)
    slow = await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH, command="sleep 60", timeout_s=1)
    assert slow.timed_out
    net = await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH,
                     command="python3 -c \"import socket; socket.create_connection(('1.1.1.1', 443), timeout=3)\"")  # fmt: skip
    assert net.exit_code != 0 and "unreachable" in net.output.lower()
    after = await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH, command="echo still here")
    assert after.output.strip() == "still here"
    await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)


async def test_idle_sessions_close_and_the_limit_holds(
    stub: swe_pb2_grpc.SweRunnerServiceStub, runner_label: str
) -> None:
    # The limit with sessions that stay open (under load, opening three took longer than a
    # 1 s idle timeout: the first had closed before the fourth was refused), then the idle
    # timeout on a session of its own.
    owners = (KEY, KEY, OTHER)
    held = [await open_session(stub, owner) for owner in owners]
    with pytest.raises(aio.AioRpcError) as info:
        await open_session(stub, OTHER)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "(sessions.max_sessions)" in (info.value.details() or "")
    for session, owner in zip(held, owners, strict=True):
        close = swe_pb2.SweCloseSessionRequest(session_id=session)
        await stub.CloseSweSession(close, metadata=owner, timeout=60)
    first = await open_session(stub, idle_timeout_s=1.0)
    for _ in range(100):
        if not labelled(runner_label):
            break
        await asyncio.sleep(0.2)
    assert labelled(runner_label) == []
    with pytest.raises(aio.AioRpcError) as info:
        await tool(stub, first, tool=swe_pb2.SWE_TOOL_BASH, command="true")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"tool": swe_pb2.SWE_TOOL_BASH, "command": ""}, "command"),
        ({"tool": swe_pb2.SWE_TOOL_VIEW}, "path"),
        ({"tool": swe_pb2.SWE_TOOL_UNSPECIFIED}, "tool"),
        ({"tool": swe_pb2.SWE_TOOL_BASH, "command": "true", "timeout_s": -1}, "timeout_s"),
    ],
)
async def test_bad_tool_calls_name_the_field(
    stub: swe_pb2_grpc.SweRunnerServiceStub, fields: dict[str, object], name: str
) -> None:
    session = await open_session(stub)
    with pytest.raises(aio.AioRpcError) as info:
        await tool(stub, session, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(f"{name}:")
    await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)


async def test_one_client_cannot_take_every_session(
    stub: swe_pb2_grpc.SweRunnerServiceStub,
) -> None:
    mine = [await open_session(stub), await open_session(stub)]
    with pytest.raises(aio.AioRpcError) as info:
        await open_session(stub)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_sessions_per_client" in (info.value.details() or "")
    request = swe_pb2.SweOpenSessionRequest(image=INSTANCE.image, workdir=INSTANCE.workdir)
    other = await stub.OpenSweSession(request, metadata=OTHER, timeout=60)
    for session in mine:
        await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)
    await stub.CloseSweSession(
        swe_pb2.SweCloseSessionRequest(session_id=other.session_id), metadata=OTHER
    )
