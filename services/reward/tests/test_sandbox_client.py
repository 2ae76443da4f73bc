"""SandboxClient against the sandbox test double (a real gRPC server on loopback).

The cross-service test against the real sandbox service (services/sandbox) remains to
be written once it lands."""

from __future__ import annotations

import time

import pytest
from reward_support import free_port
from rlfleet_contracts.sandbox_client import ExecStatus, SandboxClient, SandboxUnavailable


async def test_ok_error_timeout(sandbox_port: int) -> None:
    client = SandboxClient(f"127.0.0.1:{sandbox_port}")
    try:
        ok = await client.execute("print(input()[::-1])", stdin="abc\n", timeout_s=10)
        assert ok.status is ExecStatus.OK and ok.stdout == "cba\n" and ok.exit_code == 0
        err = await client.execute("import sys; sys.exit(4)", timeout_s=10)
        assert err.status is ExecStatus.ERROR and err.exit_code == 4
        start = time.perf_counter()
        slow = await client.execute("while True: pass", timeout_s=0.5)
        assert slow.status is ExecStatus.TIMEOUT and time.perf_counter() - start < 5
    finally:
        await client.close()


async def test_unreachable_sandbox_is_unavailable_within_deadline() -> None:
    client = SandboxClient(f"127.0.0.1:{free_port()}", call_overhead_s=0.5)
    start = time.perf_counter()
    with pytest.raises(SandboxUnavailable, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
        await client.execute("print(1)", timeout_s=0.5)
    assert time.perf_counter() - start < 5
    await client.close()


async def test_wedged_sandbox_hits_the_call_deadline() -> None:
    """A server that accepts the call and never answers: the deadline ends the wait."""
    import asyncio

    from grpc import aio
    from rlfleet_proto.v1 import sandbox_pb2_grpc

    class Wedged(sandbox_pb2_grpc.SandboxServiceServicer):
        async def Execute(self, request, context):  # type: ignore[no-untyped-def]
            await asyncio.sleep(60)

    server = aio.server()
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(Wedged(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = SandboxClient(f"127.0.0.1:{port}", call_overhead_s=0.3)
    start = time.perf_counter()
    try:
        with pytest.raises(SandboxUnavailable, match="DEADLINE_EXCEEDED"):
            await client.execute("print(1)", timeout_s=0.2)
        assert time.perf_counter() - start < 2
    finally:
        await client.close()
        await server.stop(0)
