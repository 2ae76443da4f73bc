"""The trainer service: runs a GRPO stage from its recipe in the background and answers
`GetStatus` (phase, step, weight version, last metrics) and `SaveCheckpoint` (written at
the next step boundary).

    rlfleet serve trainer recipe.policy.model=tiny run_dir=runs/x autostart=true
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from grpc import aio
from rlfleet_core.server import BaseService, ServiceDefinition
from rlfleet_proto import TRAINER_SERVICE
from rlfleet_proto.v1 import trainer_pb2_grpc

from rlfleet_trainer.config import TrainerServiceConfig
from rlfleet_trainer.context import RunContext
from rlfleet_trainer.grpc_face import TrainerServicer

logger = logging.getLogger(__name__)


class TrainerService(BaseService):
    def __init__(self, config: TrainerServiceConfig) -> None:
        self.config = config
        self.ctx: RunContext | None = None
        self.task: asyncio.Task[None] | None = None
        self.phase = "idle"
        self.checkpoint_requests: list[asyncio.Future[tuple[Path, int]]] = []
        """Shared with the run once it is built (requests may come during start-up)."""

    def add_to_server(self, server: aio.Server) -> None:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(self), server)

    async def start(self) -> None:
        if self.config.autostart:
            self.task = asyncio.create_task(self._train())

    async def _train(self) -> None:
        from rlfleet_trainer.context import build_context
        from rlfleet_trainer.loop import run_grpo

        self.phase = "starting"
        try:
            self.ctx = await asyncio.to_thread(
                build_context, self.config.recipe, Path(self.config.run_dir)
            )
            self.ctx.checkpoint_requests = self.checkpoint_requests
            await run_grpo(self.ctx, resume=self.config.resume)
            if self.config.recipe.checkpoint.export_hf:
                self.ctx.backend.export_hf(self.ctx.folder.hf)
            self.phase = "done"
        except Exception as exc:
            self.phase = "failed"
            logger.exception("training failed")
            for future in self.checkpoint_requests:
                if not future.done():
                    future.set_exception(RuntimeError(f"training failed: {exc}"))
        finally:
            if self.ctx is not None:
                self.ctx.status["phase"] = self.phase
                await self.ctx.rollout.close()
                await self.ctx.reward.close()

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


SERVICE = ServiceDefinition(
    name="trainer",
    package="rlfleet-trainer",
    grpc_services=(TRAINER_SERVICE,),
    config_model=TrainerServiceConfig,
    factory=TrainerService,
    description="GRPO trainer: policy workers, replay buffer, weight publisher, checkpoints.",
    http_face="",
)
