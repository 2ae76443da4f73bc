"""The swe-runner's gRPC face."""

from __future__ import annotations

from typing import Any

from grpc import aio
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc

from rlfleet_swe.evaluate import Evaluator
from rlfleet_swe.sessions import CLIENT_KEY_HEADER, SessionManager, owner_of


def _owner(context: aio.ServicerContext[Any, Any]) -> str:
    metadata = context.invocation_metadata() or ()
    keys = [value for key, value in metadata if key == CLIENT_KEY_HEADER]
    key = keys[0] if keys else None
    return owner_of(key if isinstance(key, str) else None)


class SweRunnerServicer(swe_pb2_grpc.SweRunnerServiceServicer):
    def __init__(self, evaluator: Evaluator, sessions: SessionManager) -> None:
        self.evaluator = evaluator
        self.sessions = sessions

    async def Evaluate(
        self, request: swe_pb2.EvaluateRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.EvaluateResult:
        return await self.evaluator.evaluate(request)

    async def OpenSweSession(
        self, request: swe_pb2.SweOpenSessionRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.SweOpenSessionReply:
        session = await self.sessions.open(_owner(context), request)
        return swe_pb2.SweOpenSessionReply(session_id=session.session_id)

    async def RunSweTool(
        self, request: swe_pb2.SweRunToolRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.SweRunToolReply:
        return await self.sessions.run_tool(_owner(context), request)

    async def CloseSweSession(
        self, request: swe_pb2.SweCloseSessionRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.SweCloseSessionReply:
        await self.sessions.close(_owner(context), request.session_id)
        return swe_pb2.SweCloseSessionReply()
