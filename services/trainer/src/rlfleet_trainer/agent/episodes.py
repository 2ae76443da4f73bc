"""The trainer's side of the reward gateway's episode RPCs (OpenEpisode, Step,
CloseEpisode). Every call has a deadline; a failure is a `RewardFailed` naming the call and
the episode. Step is not retried (a tool call may not be idempotent); the whole group is
dropped instead, as for any failed group."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from rlfleet_contracts.reward_client import RewardClient, RewardFailed, Score
from rlfleet_core.auth import CLIENT_KEY_HEADER
from rlfleet_core.calls import RpcFailure
from rlfleet_proto.v1 import reward_pb2

logger = logging.getLogger(__name__)


def _failed(rpc: RpcFailure) -> RewardFailed:
    # One episode's call: its group loses that one sample.
    return RewardFailed(rpc.message, transient=rpc.transient, failed_samples=1, rpc=rpc)


class EpisodeClient:
    def __init__(self, reward: RewardClient, timeout_s: float) -> None:
        self.reward = reward
        """Shares the reward client's channel."""
        self.timeout_s = timeout_s
        # Episodes belong to the key that opened them (the gateway answers NOT_FOUND to
        # any other caller): one random key per trainer process, never logged.
        self.metadata = ((CLIENT_KEY_HEADER, secrets.token_urlsafe(32)),)

    async def _call(self, method: str, request: Any, timeout_s: float, subject: str) -> Any:
        """One episode RPC through the reward client's endpoint (its channel, deadline and
        failure classification), with this trainer's client key."""
        return await self.reward.endpoint.call(
            method,
            request,
            timeout_s=timeout_s,
            metadata=self.metadata,
            subject=subject,
            failed=_failed,
        )

    def _deadline(self, remaining_s: float | None) -> float:
        # Even past the trajectory's wall time a call gets a short deadline, not none.
        if remaining_s is None:
            return self.timeout_s
        return max(min(self.timeout_s, remaining_s), 1.0)

    async def open(self, request_id: str, env: str, row_json: str) -> reward_pb2.Episode:
        request = reward_pb2.OpenEpisodeRequest(request_id=request_id, env=env, row_json=row_json)
        episode: reward_pb2.Episode = await self._call(
            "OpenEpisode", request, self.timeout_s, f"{request_id} ({env})"
        )
        return episode

    async def step(
        self,
        episode_id: str,
        calls: list[reward_pb2.ToolCall],
        remaining_s: float | None = None,
    ) -> reward_pb2.StepResult:
        request = reward_pb2.StepRequest(episode_id=episode_id, calls=calls)
        result: reward_pb2.StepResult = await self._call(
            "Step", request, self._deadline(remaining_s), episode_id
        )
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
        result = await self._call("CloseEpisode", request, self.timeout_s, episode_id)
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
            await self._call("CloseEpisode", request, self.timeout_s, f"{episode_id} (abandon)")
        except RewardFailed as exc:
            logger.warning("abandoning episode %s: %s", episode_id, exc)
