"""rlfleet.v1.TrainerService over gRPC: `GetStatus` reads the running stage's status,
`SaveCheckpoint` waits for the checkpoint written at the next step boundary."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio
from rlfleet_core.versions import build_info
from rlfleet_proto.v1 import trainer_pb2, trainer_pb2_grpc

from rlfleet_trainer.config import TrainerServiceConfig
from rlfleet_trainer.context import RunContext


class StageRunner(Protocol):
    """What the servicer reads of the service running the stage (TrainerService)."""

    config: TrainerServiceConfig
    ctx: RunContext | None
    task: asyncio.Task[None] | None
    phase: str
    checkpoint_requests: list[asyncio.Future[tuple[Path, int]]]


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, service: StageRunner) -> None:
        self.service = service

    async def GetStatus(
        self, request: trainer_pb2.GetTrainerStatusRequest, context: aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.TrainerStatus:
        ctx, cfg = self.service.ctx, self.service.config
        status = ctx.status if ctx is not None else {}
        return trainer_pb2.TrainerStatus(
            stage=cfg.recipe.stage if self.service.task is not None else "",
            phase=str(status.get("phase", self.service.phase)),
            step=int(status.get("step", 0)),
            total_steps=cfg.recipe.grpo.max_num_steps,
            weight_version=int(status.get("weight_version", 0)),
            metrics={k: float(v) for k, v in status.get("metrics", {}).items()},
            build=build_info("trainer", "rlfleet-trainer"),
        )

    async def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context: aio.ServicerContext[Any, Any]
    ) -> trainer_pb2.SaveCheckpointResponse:
        task = self.service.task
        if task is None or task.done():
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "no stage is training (start the service with autostart=true)",
            )
            raise AssertionError  # unreachable
        future: asyncio.Future[tuple[Path, int]] = asyncio.get_running_loop().create_future()
        self.service.checkpoint_requests.append(future)
        path, step = await asyncio.wait_for(
            future, timeout=self.service.config.save_checkpoint_timeout_s
        )
        return trainer_pb2.SaveCheckpointResponse(path=str(path), step=step)
