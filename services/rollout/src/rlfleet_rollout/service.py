"""The rollout service's definition: config, lifecycle, and the two faces over one engine.

`rlfleet serve rollout --port P --http-port H engine=vllm model=tiny` (or
`rlfleet-rollout ...`). The engine loads in `start()`, after the ports are bound, so
health says NOT_SERVING while a model loads. It says NOT_SERVING again, with the
engine's reason, while the engine refuses to generate (`serving=False` in its status:
a vllm load that failed midway, a pool with no replica in rotation) and SERVING once a
full weight update brought it back.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from grpc import aio
from rlfleet_core.errors import StartupError
from rlfleet_core.models import ModelNotFound, resolve_model
from rlfleet_core.server import BaseService, ServiceDefinition
from rlfleet_proto import ROLLOUT_SERVICE
from rlfleet_proto.v1 import rollout_pb2_grpc

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines import Engine, build_engine
from rlfleet_rollout.grpc_face import RolloutServicer
from rlfleet_rollout.http_face import OpenAIFace, add_openai_routes

logger = logging.getLogger(__name__)


class _LazyEngine:
    """Stands in for the engine until `start()` built it, so the servicer can be
    registered before the (slow) model load; calls before that are refused as UNAVAILABLE
    by the bootstrap's health gate in practice, and by this object otherwise."""

    def __getattr__(self, name: str) -> Any:
        from rlfleet_core.errors import Unavailable

        raise Unavailable("the rollout engine is still loading")


class RolloutService(BaseService):
    def __init__(self, config: RolloutServiceConfig) -> None:
        self.config = config
        self.engine: Engine | None = None
        self.model_path: Path | None = None
        self.servicer = RolloutServicer(config, _LazyEngine())  # type: ignore[arg-type,unused-ignore]
        self.face: OpenAIFace | None = None

    def add_to_server(self, server: aio.Server) -> None:
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(self.servicer, server)

    def http_routes(self, app: FastAPI) -> None:
        add_openai_routes(app, lambda: self.face)

    async def start(self) -> None:
        try:
            self.model_path = await asyncio.to_thread(resolve_model, self.config.model)
        except ModelNotFound as exc:
            raise StartupError(str(exc)) from None  # one line that says how to fix it
        engine = build_engine(self.config, self.model_path)
        await engine.start()
        self.engine = engine
        self.servicer.engine = engine
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_path)
        self.face = OpenAIFace(
            engine,
            tokenizer,
            self.config.model_id,
            aliases=(self.config.model, str(self.model_path)),
        )
        logger.info("rollout engine %s serving %s", engine.name, self.model_path)

    def not_serving_reason(self) -> str | None:
        if self.engine is None:
            return None  # not started: the bootstrap says NOT_SERVING until start() returns
        status = self.engine.status()
        if status.serving:
            return None
        why = status.not_serving_reason or "refuses to generate until a weight update lands"
        return f"{self.engine.name} engine: {why}"

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()


SERVICE = ServiceDefinition(
    name="rollout",
    package="rlfleet-rollout",
    grpc_services=(ROLLOUT_SERVICE,),
    config_model=RolloutServiceConfig,
    factory=RolloutService,
    description="Rollout: generation engines (vllm, hf) with in-flight weight updates.",
    http_face="OpenAI-compatible /v1 API (models, completions, chat/completions, responses)",
)
