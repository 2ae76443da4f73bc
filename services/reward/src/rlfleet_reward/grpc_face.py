"""rlfleet.v1.RewardService over gRPC: proto <-> domain translation around `Gateway`.

Unary calls (Score, ScoreGroup) refuse a malformed request, or one over a `limits.*` size,
with INVALID_ARGUMENT naming the field and the limit (not RESOURCE_EXHAUSTED: retrying
the same request cannot help), and a full verifier queue with RESOURCE_EXHAUSTED. A stream cannot refuse one
item without ending every other, so ScoreStream answers such items with a result whose
failure_kind is INVALID_ROW / OVERLOADED instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio
from rlfleet_contracts.rows import NEMO_GYM_NAMES
from rlfleet_core.errors import InvalidArgument, ResourceExhausted
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

from rlfleet_reward.episodes.face import EpisodeCalls
from rlfleet_reward.episodes.manager import EpisodeManager
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.limits import check_size
from rlfleet_reward.score_proto import result_to_proto, sample_from_proto
from rlfleet_reward.types import FailureKind, Overloaded, failure


def _env(name: str) -> str:
    """Our environment for `name` (NeMo-Gym agent and server names mapped)."""
    return NEMO_GYM_NAMES.get(name, name)


class RewardServicer(EpisodeCalls, reward_pb2_grpc.RewardServiceServicer):
    def __init__(
        self, gateway: Gateway, max_stream_in_flight: int, episodes: EpisodeManager | None = None
    ) -> None:
        self.gateway = gateway
        self.max_stream_in_flight = max_stream_in_flight
        self.episodes = episodes or EpisodeManager(gateway)

    def _check_size(self, request: reward_pb2.ScoreRequest | reward_pb2.ScoreGroupRequest) -> None:
        limit = self.gateway.config.limits.max_request_bytes
        check_size(request.ByteSize(), limit, "request", "max_request_bytes", "bytes")

    async def Score(
        self, request: reward_pb2.ScoreRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreResult:
        self._check_size(request)
        row = self.gateway.parse_row_json(request.row_json)
        try:
            score = await self.gateway.score(
                _env(request.env),
                row,
                sample_from_proto(request.response),
                context.time_remaining(),
            )
        except Overloaded as exc:
            raise ResourceExhausted(str(exc)) from None
        return result_to_proto(request.request_id, request.env, score)

    async def ScoreGroup(
        self, request: reward_pb2.ScoreGroupRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreGroupResult:
        if not request.responses:
            raise InvalidArgument("responses", "must hold at least one response")
        self._check_size(request)
        row = self.gateway.parse_row_json(request.row_json)
        samples = [sample_from_proto(r) for r in request.responses]
        try:
            scores = await self.gateway.score_group(
                _env(request.env), row, samples, context.time_remaining()
            )
        except Overloaded as exc:
            raise ResourceExhausted(str(exc)) from None
        return reward_pb2.ScoreGroupResult(
            request_id=request.request_id,
            results=[result_to_proto(request.request_id, request.env, s) for s in scores],
        )

    async def _score_stream_item(
        self, request: reward_pb2.ScoreRequest, deadline_s: float | None
    ) -> reward_pb2.ScoreResult:
        try:
            self._check_size(request)
            row = self.gateway.parse_row_json(request.row_json)
            score = await self.gateway.score(
                _env(request.env), row, sample_from_proto(request.response), deadline_s
            )
        except InvalidArgument as exc:
            score = failure(FailureKind.INVALID_ROW, exc.message)
        except Overloaded as exc:
            score = failure(FailureKind.OVERLOADED, str(exc))
        return result_to_proto(request.request_id, request.env, score)

    async def ScoreStream(
        self,
        request_iterator: AsyncIterator[reward_pb2.ScoreRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[reward_pb2.ScoreResult]:
        results: asyncio.Queue[reward_pb2.ScoreResult | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self.max_stream_in_flight)
        tasks: set[asyncio.Task[None]] = set()

        async def one(request: reward_pb2.ScoreRequest) -> None:
            try:
                await results.put(await self._score_stream_item(request, context.time_remaining()))
            finally:
                slots.release()

        async def read_all() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()  # flow control: stop reading while the window is full
                    task = asyncio.create_task(one(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*tasks)
            finally:
                results.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await results.get()) is not None:
                yield item
            await reader  # surfaces a failed request stream
        finally:
            for task in (reader, *tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def ListEnvironments(
        self, request: reward_pb2.ListEnvironmentsRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ListEnvironmentsResponse:
        return reward_pb2.ListEnvironmentsResponse(
            environments=[
                reward_pb2.EnvironmentInfo(
                    name=e.name,
                    description=e.description,
                    required_fields=e.required_fields,
                    optional_fields=e.optional_fields,
                    group_aware=e.group_aware,
                    multi_turn=e.multi_turn,
                )
                # Multi-turn first: a client that keys the list by name (written before
                # `multi_turn` existed) still ends up with Score's `tool_use`.
                for e in [*self.episodes.environments(), *self.gateway.environments()]
            ]
        )
