"""The sandbox service's definition: config, faces and lifecycle."""

from __future__ import annotations

from fastapi import FastAPI
from grpc import aio
from rlfleet_core.server import BaseService, ServiceDefinition
from rlfleet_proto import SANDBOX_SERVICE
from rlfleet_proto.v1 import sandbox_pb2_grpc

from rlfleet_sandbox.config import SandboxServiceConfig
from rlfleet_sandbox.engine import SandboxEngine
from rlfleet_sandbox.grpc_face import SandboxServicer
from rlfleet_sandbox.http_face import add_routes

__all__ = ["SERVICE", "SandboxService", "SandboxServiceConfig"]


class SandboxService(BaseService):
    def __init__(self, config: SandboxServiceConfig) -> None:
        self.config = config
        self.engine = SandboxEngine(config)

    def add_to_server(self, server: aio.Server) -> None:
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(SandboxServicer(self.engine), server)

    def http_routes(self, app: FastAPI) -> None:
        add_routes(app, self.engine)

    async def start(self) -> None:
        # Fills the warm pool; fails start-up if bubblewrap cannot isolate here.
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()


SERVICE = ServiceDefinition(
    name="sandbox",
    package="rlfleet-sandbox",
    grpc_services=(SANDBOX_SERVICE,),
    config_model=SandboxServiceConfig,
    factory=SandboxService,
    description="Sandbox: isolated code execution and stateful Python sessions.",
    http_face="NeMo-Skills-compatible POST /execute, GET /health, GET /sessions, DELETE /sessions/{id}",
)
