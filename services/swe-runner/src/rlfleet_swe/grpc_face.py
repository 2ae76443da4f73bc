"""The swe-runner's gRPC face."""

from __future__ import annotations

from typing import Any

from grpc import aio
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc

from rlfleet_swe.evaluate import Evaluator


class SweRunnerServicer(swe_pb2_grpc.SweRunnerServiceServicer):
    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    async def Evaluate(
        self, request: swe_pb2.EvaluateRequest, context: aio.ServicerContext[Any, Any]
    ) -> swe_pb2.EvaluateResult:
        return await self.evaluator.evaluate(request)
