"""The swe-runner's gRPC face. No RPC is built yet: each raises NotImplementedError, which
the shared error interceptor (rlfleet_core.interceptors) answers as UNIMPLEMENTED naming
the RPC."""

from __future__ import annotations

from typing import Any

from grpc import aio
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc


class SweRunnerServicer(swe_pb2_grpc.SweRunnerServiceServicer):
    async def Evaluate(
        self, request: swe_pb2.EvaluateRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.EvaluateResult:
        raise NotImplementedError
