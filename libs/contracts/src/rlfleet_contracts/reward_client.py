"""The RewardService.ScoreGroup contract on the caller's side: `RewardClient` (asyncio, the
trainer) and `BlockingRewardClient` (its thin blocking wrapper, data prep's curriculum
pass).

No silent zero: a failed call, a reply of the wrong length or a failed score fails the
whole group (`RewardFailed`) once its retries are spent; a wrong reward would train the
model on noise, and GRPO's baseline needs every sample of the group. Calls go through
`rlfleet_core.calls` (deadline, one classification of failures); a retry (`CallRetry`)
follows a transient status or sample failures of the kinds in `TRANSIENT_REWARD_FAILURES`
only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpc import aio
from rlfleet_core.calls import (
    DEFAULT_RETRY,
    CallFailed,
    CallRetry,
    Endpoint,
    RpcFailure,
    call_with_retry,
)
from rlfleet_core.client import connect
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

from rlfleet_contracts.judge_tally import JudgeTally, judge_calls_of

logger = logging.getLogger(__name__)

TRANSIENT_REWARD_FAILURES = frozenset(
    {
        reward_pb2.FAILURE_KIND_TIMEOUT,
        reward_pb2.FAILURE_KIND_SANDBOX_ERROR,
        reward_pb2.FAILURE_KIND_JUDGE_ERROR,
        reward_pb2.FAILURE_KIND_OVERLOADED,
    }
)
"""Reward failures another try may not repeat; INVALID_ROW and VERIFIER_ERROR would."""


class RewardFailed(CallFailed):
    """A reward call failed, or left samples without a score; the message says why."""


class SamplesFailed(RewardFailed):
    """The call answered, but some samples came back as failures."""


@dataclass(frozen=True)
class Score:
    reward: float
    masked: bool
    """The reward service asks to leave this sample out of the loss."""
    info: dict[str, str] = dataclasses.field(default_factory=dict)
    """What the verifier saw (ScoreResult.info); kept for multi-turn episodes, whose
    `calls/<kind>` counts the trainer reads (agent.calls)."""


@dataclass
class GroupScores:
    """A group's scores after retries: None where a sample has none, `problem` says why."""

    scores: list[Score | None]
    problem: str = ""

    @property
    def failed_samples(self) -> int:
        return sum(score is None for score in self.scores)


class RewardClient:
    """ScoreGroup against a RewardService (`stub` also serves the episode RPCs)."""

    def __init__(self, target: str, timeout_s: float, retry: CallRetry = DEFAULT_RETRY) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.retry = retry
        self.retries = 0
        """ScoreGroup tries repeated after a transient failure, since the client was made."""
        self.judge = JudgeTally()
        """Judged groups (genrm_compare) since the last `judge.take()` (a step's window)."""
        # The channel is made on first use, inside the event loop that will use it (the
        # client itself may be built in a worker thread).
        self._channel: aio.Channel | None = None
        self._endpoint: Endpoint | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            self._channel = connect(self.target, default_timeout_s=self.timeout_s)
            stub = reward_pb2_grpc.RewardServiceStub(self._channel)
            self._endpoint = Endpoint("reward", self.target, stub)
        return self._endpoint

    @property
    def stub(self) -> Any:
        # grpc's stub types describe the blocking API; the aio stub is used untyped.
        return self.endpoint.stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def score_group(
        self,
        request_id: str,
        env: str,
        row_json: str,
        texts: Sequence[str],
        num_tokens: Sequence[int],
    ) -> list[Score]:
        """One reward per response, or RewardFailed when any sample is left without one
        after retries (never a silent 0): GRPO's baseline needs the whole group."""
        group = await self.score_samples(request_id, env, row_json, texts, num_tokens)
        if group.failed_samples:
            raise RewardFailed(
                f"ScoreGroup {request_id} ({env}): {group.failed_samples} of "
                f"{len(texts)} samples failed: {group.problem}",
                transient=False,
                failed_samples=group.failed_samples,
            )
        return [score for score in group.scores if score is not None]

    async def score_samples(
        self,
        request_id: str,
        env: str,
        row_json: str,
        texts: Sequence[str],
        num_tokens: Sequence[int],
    ) -> GroupScores:
        """Each response's score, None where its failure outlived the retries; raises
        RewardFailed only when the call itself failed. A retry resends the whole group
        (group-aware environments score responses against each other) and each sample
        keeps the first score it gets."""
        request = reward_pb2.ScoreGroupRequest(
            request_id=request_id,
            env=env,
            row_json=row_json,
            responses=[
                reward_pb2.Response(text=text, num_tokens=count)
                for text, count in zip(texts, num_tokens, strict=True)
            ],
        )
        group = GroupScores([None] * len(texts))

        async def attempt(_: int) -> GroupScores:
            await self._score_once(request, group)
            return group

        try:
            return await call_with_retry(
                attempt, self.retry, f"ScoreGroup {request_id}", self._count_retry
            )
        except SamplesFailed:
            return group

    def _count_retry(self) -> None:
        self.retries += 1

    async def _score_once(self, request: reward_pb2.ScoreGroupRequest, group: GroupScores) -> None:
        """One ScoreGroup call merged into `group`; RewardFailed (transient when every
        failure left is) while samples still lack a score."""
        name = f"ScoreGroup {request.request_id} ({request.env})"
        expected = len(group.scores)

        def failed(rpc: RpcFailure) -> RewardFailed:
            return RewardFailed(
                rpc.message, transient=rpc.transient, failed_samples=expected, rpc=rpc
            )

        started = time.monotonic()
        reply = await self.endpoint.call(
            "ScoreGroup",
            request,
            timeout_s=self.timeout_s,
            subject=f"{request.request_id} ({request.env})",
            failed=failed,
        )
        if len(reply.results) != expected:
            raise RewardFailed(
                f"{name}: {len(reply.results)} results for {expected} responses",
                transient=False,
                failed_samples=expected,
            )
        calls = judge_calls_of(result.info for result in reply.results)
        if calls is not None:
            self.judge.record(calls, started, time.monotonic())
        kinds: list[int] = []
        for index, result in enumerate(reply.results):
            if group.scores[index] is not None:
                continue
            if result.failure_kind == reward_pb2.FAILURE_KIND_NONE:
                group.scores[index] = Score(reward=result.reward, masked=result.mask_sample)
                continue
            if not kinds:
                kind = reward_pb2.FailureKind.Name(result.failure_kind)
                group.problem = f"{kind}: {result.failure_reason}"
            kinds.append(result.failure_kind)
        logger.debug("scored %s in %.3fs", request.request_id, time.monotonic() - started)
        if kinds:
            raise SamplesFailed(
                f"{name}: {len(kinds)} of {expected} samples failed: {group.problem}",
                transient=all(kind in TRANSIENT_REWARD_FAILURES for kind in kinds),
                failed_samples=len(kinds),
            )


ONE_TRY = CallRetry(attempts=1)


class BlockingRewardClient:
    """`RewardClient` for callers without an event loop, from any number of threads at once
    (data prep's curriculum pass scores rows from a thread pool): the async client runs
    on an event loop in a thread of this object's own, and each call waits for its result
    there. One try per call by default (data prep fails the row at once; the channel
    still retries UNAVAILABLE before any answer)."""

    def __init__(self, target: str, timeout_s: float, retry: CallRetry = ONE_TRY) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="reward-client", daemon=True
        )
        self._thread.start()
        self.client = RewardClient(target, timeout_s, retry)

    def score_group(
        self, request_id: str, env: str, row: dict[str, Any], responses: Sequence[tuple[str, int]]
    ) -> list[Score]:
        """Scores of `responses` (text, generated tokens) of `row` in order, or
        RewardFailed (`RewardClient.score_group`)."""
        texts = [text for text, _ in responses]
        tokens = [count for _, count in responses]
        call = self.client.score_group(request_id, env, json.dumps(row), texts, tokens)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()
