"""The swe-runner service's definition: config, servicer and lifecycle."""

from __future__ import annotations

import logging

from grpc import aio
from rlfleet_core.server import BaseService, ServiceDefinition
from rlfleet_proto import SWE_RUNNER_SERVICE
from rlfleet_proto.v1 import swe_pb2_grpc

from rlfleet_swe.backends import RunnerIdentity, make_backend
from rlfleet_swe.config import SweRunnerServiceConfig
from rlfleet_swe.evaluate import Evaluator
from rlfleet_swe.grpc_face import SweRunnerServicer
from rlfleet_swe.sessions import SessionManager

logger = logging.getLogger(__name__)


class SweRunnerService(BaseService):
    def __init__(self, config: SweRunnerServiceConfig) -> None:
        self.config = config
        self.identity = RunnerIdentity(config.eval.runner_label)
        self.backend = make_backend(config.eval, self.identity)
        self.evaluator = Evaluator(config.eval, self.backend)
        self.sessions = SessionManager(config.eval, config.sessions, self.identity)

    def add_to_server(self, server: aio.Server) -> None:
        swe_pb2_grpc.add_SweRunnerServiceServicer_to_server(
            SweRunnerServicer(self.evaluator, self.sessions), server
        )

    async def start(self) -> None:
        # Without a container engine the service still serves: each call then reports
        # EVAL_STATUS_INFRA_ERROR (or UNAVAILABLE for sessions) naming what is missing.
        try:
            removed = await self.backend.remove_stale()
        except (OSError, TimeoutError) as error:
            logger.warning("could not look for leftover containers: %s", error)
        else:
            if removed:
                logger.info("removed %d leftover swe-runner containers", removed)
        await self.sessions.start()

    async def stop(self) -> None:
        await self.sessions.stop()
        # Anything of this instance still there (a removal that timed out) goes now.
        try:
            await self.backend.remove_own()
        except (OSError, TimeoutError) as error:
            logger.warning("could not remove this runner's containers: %s", error)


SERVICE = ServiceDefinition(
    name="swe-runner",
    package="rlfleet-swe",
    grpc_services=(SWE_RUNNER_SERVICE,),
    config_model=SweRunnerServiceConfig,
    factory=SweRunnerService,
    description="SWE runner: applies a patch in the task's container and runs its tests.",
    http_face="",
)
