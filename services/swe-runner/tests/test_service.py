"""The swe-runner service under the shared bootstrap: health, and RPCs not built yet answer
UNIMPLEMENTED with a message (its own issue replaces this with the real servicer)."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.service import SERVICE


async def test_health_and_unimplemented_rpcs() -> None:
    async with (
        running_service(SERVICE) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.SweRunnerService")
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Evaluate(swe_pb2.EvaluateRequest())
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "Evaluate is not implemented yet" in (info.value.details() or "")
