"""The reward service's definition: wiring of config, gateway, gRPC servicer and HTTP routes.

`rlfleet serve reward --port P --http-port H` (and `rlfleet-reward`) run `SERVICE`
under the shared bootstrap: ports are bound first, then `start()` warms the verifier
pool (health turns SERVING only once workers are ready), and `stop()` retires workers
after calls in flight have finished.
"""

from __future__ import annotations

import gc

from fastapi import FastAPI
from grpc import aio
from rlfleet_contracts.sandbox_client import SandboxClient
from rlfleet_core.server import BaseService, ServiceDefinition
from rlfleet_proto import REWARD_SERVICE
from rlfleet_proto.v1 import reward_pb2_grpc

from rlfleet_reward.config import RewardServiceConfig
from rlfleet_reward.episodes.manager import EpisodeManager
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.grpc_face import RewardServicer
from rlfleet_reward.http_face import add_routes
from rlfleet_reward.row_check import check_row


class RewardService(BaseService):
    def __init__(self, config: RewardServiceConfig, sandbox: SandboxClient | None = None) -> None:
        self.config = config
        self.gateway = Gateway(config, sandbox=sandbox)
        self.episodes = EpisodeManager(self.gateway)

    def add_to_server(self, server: aio.Server) -> None:
        servicer = RewardServicer(self.gateway, self.config.max_stream_in_flight, self.episodes)
        reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, server)

    def http_routes(self, app: FastAPI) -> None:
        add_routes(app, self.gateway)

    async def start(self) -> None:
        await self.gateway.start()
        await self.episodes.start()
        # What start-up imported and built lives as long as the process: out of the
        # collector's sight, so a full collection under load walks only what requests
        # made (it walked every object of the libraries: a stall of tens of ms for all
        # requests in flight, issue 28).
        gc.freeze()

    async def stop(self) -> None:
        await self.episodes.stop()
        await self.gateway.stop()


SERVICE = ServiceDefinition(
    name="reward",
    package="rlfleet-reward",
    grpc_services=(REWARD_SERVICE,),
    config_model=RewardServiceConfig,
    factory=RewardService,
    description="Reward gateway: verifiable-reward environments, judges and GenRM.",
    http_face=(
        "NeMo-Gym-compatible /verify, /seed_session, /aggregate_metrics "
        "(root and /{env}/...), GET /reverify_mode"
    ),
    check_row=check_row,
)
