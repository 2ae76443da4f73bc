"""OpenEpisode / Step / CloseEpisode over gRPC: proto <-> `EpisodeManager`."""

from __future__ import annotations

from typing import Any

from grpc import aio
from rlfleet_core.auth import grpc_client_key, owner_of
from rlfleet_proto.v1 import reward_pb2

from rlfleet_reward.episodes.manager import Call, EpisodeManager
from rlfleet_reward.episodes.tools import schema_json
from rlfleet_reward.limits import check_size
from rlfleet_reward.score_proto import result_to_proto, sample_from_proto


class EpisodeCalls:
    """The episode half of RewardServicer (mixed into it)."""

    episodes: EpisodeManager

    def _owner(self, context: aio.ServicerContext[Any, Any]) -> str:
        return owner_of(grpc_client_key(context), self.episodes.config.allow_keyless)

    def _check_request(self, request: Any) -> None:
        limit = self.episodes.gateway.config.limits.max_request_bytes
        check_size(request.ByteSize(), limit, "request", "max_request_bytes", "bytes")

    async def OpenEpisode(
        self, request: reward_pb2.OpenEpisodeRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.Episode:
        owner = self._owner(context)
        self._check_request(request)
        self.episodes.environment(request.env)  # an unknown env before the row's errors
        row = self.episodes.gateway.parse_row_json(request.row_json)
        episode_id, tools = await self.episodes.open(owner, request.env, row)
        return reward_pb2.Episode(
            episode_id=episode_id,
            tools=[
                reward_pb2.ToolSpec(
                    name=t.name, description=t.description, parameters_json=schema_json(t)
                )
                for t in tools
            ],
            idle_timeout_s=self.episodes.config.idle_timeout_s,
        )

    async def Step(
        self, request: reward_pb2.StepRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.StepResult:
        owner = self._owner(context)
        self._check_request(request)
        calls = [
            Call(c.call_id or f"call_{i}", c.name, c.arguments_json)
            for i, c in enumerate(request.calls)
        ]
        results, done = await self.episodes.step(owner, request.episode_id, calls)
        return reward_pb2.StepResult(
            results=[
                reward_pb2.ToolResult(
                    call_id=r.call_id, name=r.name, content=r.content, error=r.error
                )
                for r in results
            ],
            done=done,
        )

    async def CloseEpisode(
        self, request: reward_pb2.CloseEpisodeRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreResult:
        owner = self._owner(context)
        self._check_request(request)
        sample = None
        if not request.abandon:
            sample = sample_from_proto(request.response)
            self.episodes.gateway.check_samples([sample])
        episode = self.episodes.env_of(owner, request.episode_id)
        score = await self.episodes.close(
            owner, request.episode_id, sample, context.time_remaining()
        )
        if score is None:
            return reward_pb2.ScoreResult(
                request_id=request.episode_id,
                env=episode,
                mask_sample=True,
                info={"abandoned": "true"},
            )
        return result_to_proto(request.episode_id, episode, score)
