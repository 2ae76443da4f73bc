"""The swe-runner service's definition: config, servicer and lifecycle."""

from __future__ import annotations

from grpc import aio
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition
from rlfleet_proto import SWE_RUNNER_SERVICE
from rlfleet_proto.v1 import swe_pb2_grpc

from rlfleet_swe.grpc_face import SweRunnerServicer


class SweRunnerServiceConfig(ServiceConfig):
    """Settings of the swe-runner service (`server.*` is shared by every service)."""


class SweRunnerService(BaseService):
    def __init__(self, config: SweRunnerServiceConfig) -> None:
        self.config = config

    def add_to_server(self, server: aio.Server) -> None:
        swe_pb2_grpc.add_SweRunnerServiceServicer_to_server(SweRunnerServicer(), server)


SERVICE = ServiceDefinition(
    name="swe-runner",
    package="rlfleet-swe",
    grpc_services=(SWE_RUNNER_SERVICE,),
    config_model=SweRunnerServiceConfig,
    factory=SweRunnerService,
    description="SWE runner: applies a patch in the task's container and runs its tests.",
    http_face="",
)
