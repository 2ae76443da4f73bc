"""The rollout service's definition: config, servicer and lifecycle."""

from __future__ import annotations

from grpc import aio
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition
from rlfleet_proto import ROLLOUT_SERVICE
from rlfleet_proto.v1 import rollout_pb2_grpc


class RolloutServiceConfig(ServiceConfig):
    """Settings of the rollout service (`server.*` is shared by every service)."""


class RolloutService(BaseService):
    def __init__(self, config: RolloutServiceConfig) -> None:
        self.config = config

    def add_to_server(self, server: aio.Server) -> None:
        # The generated base servicer answers UNIMPLEMENTED for every RPC until the
        # service's own servicer replaces it.
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(
            rollout_pb2_grpc.RolloutServiceServicer(), server
        )  # type: ignore[abstract]


SERVICE = ServiceDefinition(
    name="rollout",
    package="rlfleet-rollout",
    grpc_services=(ROLLOUT_SERVICE,),
    config_model=RolloutServiceConfig,
    factory=RolloutService,
    description="Rollout: generation engines (vllm, hf) with in-flight weight updates.",
    http_face="OpenAI-compatible /v1 API",
)
