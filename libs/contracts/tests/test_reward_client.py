"""The reward client's reading of a ScoreGroup reply, against a real gRPC server on
loopback that answers what each case needs: a count mismatch and a failed sample are
errors naming what went wrong (never a silent 0), a transient failure is tried again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import pytest_asyncio
from grpc import aio
from rlfleet_contracts.reward_client import BlockingRewardClient, RewardClient, RewardFailed
from rlfleet_core.calls import CallRetry
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

OK = reward_pb2.ScoreResult(reward=1.0)
TIMED_OUT = reward_pb2.ScoreResult(
    failure_kind=reward_pb2.FAILURE_KIND_TIMEOUT, failure_reason="verifier took 30 s"
)
WRONG_ROW = reward_pb2.ScoreResult(
    failure_kind=reward_pb2.FAILURE_KIND_INVALID_ROW, failure_reason="row has no answer"
)


class Replies(reward_pb2_grpc.RewardServiceServicer):
    """Answers each ScoreGroup with the next reply of `replies`."""

    def __init__(self) -> None:
        self.replies: list[list[reward_pb2.ScoreResult]] = []
        self.calls = 0

    async def ScoreGroup(self, request: Any, context: Any) -> reward_pb2.ScoreGroupResult:
        self.calls += 1
        return reward_pb2.ScoreGroupResult(results=self.replies.pop(0))


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[Replies, str]]:
    server = aio.server()
    replies = Replies()
    reward_pb2_grpc.add_RewardServiceServicer_to_server(replies, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield replies, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _score(target: str, attempts: int = 1) -> list[float]:
    client = RewardClient(target, 10.0, CallRetry(attempts=attempts, backoff_s=0.01))
    try:
        scores = await client.score_group("g1", "math", "{}", ["a", "b"], [1, 1])
        return [score.reward for score in scores]
    finally:
        await client.close()


async def test_a_reply_of_the_wrong_length_is_an_error_naming_both_counts(
    served: tuple[Replies, str],
) -> None:
    replies, target = served
    replies.replies = [[OK]]
    with pytest.raises(RewardFailed, match="1 results for 2 responses"):
        await _score(target)


async def test_a_failed_sample_is_an_error_naming_its_kind_and_reason(
    served: tuple[Replies, str],
) -> None:
    replies, target = served
    replies.replies = [[OK, WRONG_ROW]]
    with pytest.raises(RewardFailed, match="1 of 2 samples failed: FAILURE_KIND_INVALID_ROW"):
        await _score(target, attempts=3)
    assert replies.calls == 1  # a bad row is not tried again


async def test_a_transient_failure_is_tried_again_and_keeps_the_first_scores(
    served: tuple[Replies, str],
) -> None:
    replies, target = served
    replies.replies = [[OK, TIMED_OUT], [TIMED_OUT, reward_pb2.ScoreResult(reward=0.5)]]
    assert await _score(target, attempts=2) == [1.0, 0.5]
    assert replies.calls == 2


async def test_the_blocking_client_serves_several_threads_at_once(
    served: tuple[Replies, str],
) -> None:
    """Data prep's curriculum pass scores rows from a thread pool through one client."""
    replies, target = served
    replies.replies = [[OK, OK] for _ in range(8)]
    client = BlockingRewardClient(target, 10.0)

    def score(i: int) -> list[float]:
        scores = client.score_group(f"g{i}", "math", {"id": i}, [("a", 1), ("b", 1)])
        return [s.reward for s in scores]

    try:
        with ThreadPoolExecutor(4) as pool:
            done = await asyncio.get_running_loop().run_in_executor(
                None, lambda: list(pool.map(score, range(8)))
            )
    finally:
        await asyncio.get_running_loop().run_in_executor(None, client.close)
    assert done == [[1.0, 1.0]] * 8 and replies.calls == 8
