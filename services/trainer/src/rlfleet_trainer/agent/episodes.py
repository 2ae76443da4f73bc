"""The trainer's side of the reward gateway's episode RPCs (OpenEpisode, Step,
CloseEpisode). Every call has a deadline; a failure is a `RewardFailed` naming the call and
the episode. Step is not retried (a tool call may not be idempotent); the whole group is
dropped instead, as for any failed group."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from grpc import aio
from rlfleet_contracts.reward_client import RewardClient, RewardFailed, Score
from rlfleet_core.auth import CLIENT_KEY_HEADER
from rlfleet_core.calls import TRANSIENT_CODES
from rlfleet_proto.v1 import reward_pb2

logger = logging.getLogger(__name__)


class EpisodeClient:
    def __init__(self, reward: RewardClient, timeout_s: float) -> None:
        self.reward = reward
        """Shares the reward client's channel."""
        self.timeout_s = timeout_s
        # Episodes belong to the key that opened them (the gateway answers NOT_FOUND to
        # any other caller): one random key per trainer process, never logged.
        self.metadata = ((CLIENT_KEY_HEADER, secrets.token_urlsafe(32)),)

    @property
    def stub(self) -> Any:
        return self.reward.stub

    def _failed(self, what: str, exc: aio.AioRpcError) -> RewardFailed:
        return RewardFailed(
            f"{what} on {self.reward.target}: {exc.code().name} {exc.details()}",
            transient=exc.code() in TRANSIENT_CODES,
            failed_samples=1,
        )

    def _deadline(self, remaining_s: float | None) -> float:
        # Even past the trajectory's wall time a call gets a short deadline, not none.
        if remaining_s is None:
            return self.timeout_s
        return max(min(self.timeout_s, remaining_s), 1.0)

    async def open(self, request_id: str, env: str, row_json: str) -> reward_pb2.Episode:
        request = reward_pb2.OpenEpisodeRequest(request_id=request_id, env=env, row_json=row_json)
        try:
            episode: reward_pb2.Episode = await self.stub.OpenEpisode(
                request, metadata=self.metadata, timeout=self.timeout_s
            )
        except aio.AioRpcError as exc:
            raise self._failed(f"OpenEpisode {request_id} ({env})", exc) from None
        return episode

    async def step(
        self,
        episode_id: str,
        calls: list[reward_pb2.ToolCall],
        remaining_s: float | None = None,
    ) -> reward_pb2.StepResult:
        request = reward_pb2.StepRequest(episode_id=episode_id, calls=calls)
        try:
            result: reward_pb2.StepResult = await self.stub.Step(
                request, metadata=self.metadata, timeout=self._deadline(remaining_s)
            )
        except aio.AioRpcError as exc:
            raise self._failed(f"Step {episode_id}", exc) from None
        if len(result.results) != len(calls):
            raise RewardFailed(
                f"Step {episode_id}: {len(result.results)} results for {len(calls)} calls",
                transient=False,
                failed_samples=1,
            )
        return result

    async def close(self, episode_id: str, text: str, reasoning: str, num_tokens: int) -> Score:
        """Score the episode's end state (`text`: the last turn's answer, `num_tokens`: the
        model's tokens of the whole trajectory); a reward failure is a RewardFailed."""
        request = reward_pb2.CloseEpisodeRequest(
            episode_id=episode_id,
            response=reward_pb2.Response(
                text=text, reasoning_text=reasoning, num_tokens=num_tokens
            ),
        )
        try:
            result = await self.stub.CloseEpisode(
                request, metadata=self.metadata, timeout=self.timeout_s
            )
        except aio.AioRpcError as exc:
            raise self._failed(f"CloseEpisode {episode_id}", exc) from None
        if result.failure_kind != reward_pb2.FAILURE_KIND_NONE:
            kind = reward_pb2.FailureKind.Name(result.failure_kind)
            raise RewardFailed(
                f"CloseEpisode {episode_id}: {kind}: {result.failure_reason}",
                transient=False,
                failed_samples=1,
            )
        return Score(reward=result.reward, masked=result.mask_sample, info=dict(result.info))

    async def abandon(self, episode_id: str) -> None:
        """Free the episode unscored; a failure is only logged (the gateway's idle timeout
        frees it anyway)."""
        request = reward_pb2.CloseEpisodeRequest(episode_id=episode_id, abandon=True)
        try:
            # With the key that opened it: the gateway refuses a keyless close.
            await self.stub.CloseEpisode(request, metadata=self.metadata, timeout=self.timeout_s)
        except aio.AioRpcError as exc:
            logger.warning(
                "abandoning episode %s: %s %s", episode_id, exc.code().name, exc.details()
            )
