"""The reward service's definition: config, servicer and lifecycle."""

from __future__ import annotations

from grpc import aio
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition
from rlfleet_proto import REWARD_SERVICE
from rlfleet_proto.v1 import reward_pb2_grpc


class RewardServiceConfig(ServiceConfig):
    """Settings of the reward service (`server.*` is shared by every service)."""


class RewardService(BaseService):
    def __init__(self, config: RewardServiceConfig) -> None:
        self.config = config

    def add_to_server(self, server: aio.Server) -> None:
        # The generated base servicer answers UNIMPLEMENTED for every RPC until the
        # service's own servicer replaces it.
        reward_pb2_grpc.add_RewardServiceServicer_to_server(reward_pb2_grpc.RewardServiceServicer(), server)


SERVICE = ServiceDefinition(
    name="reward",
    package="rlfleet-reward",
    grpc_services=(REWARD_SERVICE,),
    config_model=RewardServiceConfig,
    factory=RewardService,
    description="Reward gateway: verifiable-reward environments, judges and GenRM.",
    http_face="NeMo-Gym-compatible /{env}/verify",
)
