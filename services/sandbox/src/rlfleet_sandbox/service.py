"""The sandbox service's definition: config, servicer and lifecycle."""

from __future__ import annotations

from grpc import aio
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition
from rlfleet_proto import SANDBOX_SERVICE
from rlfleet_proto.v1 import sandbox_pb2_grpc


class SandboxServiceConfig(ServiceConfig):
    """Settings of the sandbox service (`server.*` is shared by every service)."""


class SandboxService(BaseService):
    def __init__(self, config: SandboxServiceConfig) -> None:
        self.config = config

    def add_to_server(self, server: aio.Server) -> None:
        # The generated base servicer answers UNIMPLEMENTED for every RPC until the
        # service's own servicer replaces it.
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(sandbox_pb2_grpc.SandboxServiceServicer(), server)


SERVICE = ServiceDefinition(
    name="sandbox",
    package="rlfleet-sandbox",
    grpc_services=(SANDBOX_SERVICE,),
    config_model=SandboxServiceConfig,
    factory=SandboxService,
    description="Sandbox: isolated code execution and stateful Python sessions.",
    http_face="NeMo-Skills-compatible /execute",
)
