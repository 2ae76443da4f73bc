"""The trainer service's definition: config, servicer and lifecycle."""

from __future__ import annotations

from grpc import aio
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition
from rlfleet_proto import TRAINER_SERVICE
from rlfleet_proto.v1 import trainer_pb2_grpc


class TrainerServiceConfig(ServiceConfig):
    """Settings of the trainer service (`server.*` is shared by every service)."""


class TrainerService(BaseService):
    def __init__(self, config: TrainerServiceConfig) -> None:
        self.config = config

    def add_to_server(self, server: aio.Server) -> None:
        # The generated base servicer answers UNIMPLEMENTED for every RPC until the
        # service's own servicer replaces it.
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(
            trainer_pb2_grpc.TrainerServiceServicer(), server
        )  # type: ignore[abstract]


SERVICE = ServiceDefinition(
    name="trainer",
    package="rlfleet-trainer",
    grpc_services=(TRAINER_SERVICE,),
    config_model=TrainerServiceConfig,
    factory=TrainerService,
    description="GRPO trainer: policy workers, replay buffer, weight publisher, checkpoints.",
    http_face="",
)
